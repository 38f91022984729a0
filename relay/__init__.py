"""What the bot and the workers share to move a turn, and nothing else: the settings, the Celery app (built by
whoever runs, never at import), claims and cancel marks, the blob store and the embedded SQLite transport.

It imports `game` and the queue's libraries, never `bot`, `worker`, `db` or torch, so the bot and the worker
each import it and not each other.
"""
