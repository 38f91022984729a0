"""MP4 for the bot and the workers alike: one encoder, one decoder, one probe (media/mp4.py), and the bot's joining
and fitting of clips (media/clips.py). PyAV and numpy only, never torch, so the bot imports it too.
"""
