"""The training room: toy-world data now, AnimeGamer's three training phases later.

The toy world (``training.toyworld``) renders clips whose instruction, motion and state changes
are known exactly, so each phase can be trained and checked on a CPU without any download;
``training.dataset`` writes and reads those clips as a verified folder. This room may import
``game``, ``worker.pipeline``, torch, numpy and Pillow; nothing imports it but the CLI and tests.
"""
