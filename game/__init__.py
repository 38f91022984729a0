"""The game's rules, pure: no I/O, importable by the bot and the worker alike."""
