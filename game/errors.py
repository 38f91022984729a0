"""Refusals the rules themselves make: each carries one short sentence that is safe to show a player.

The bot answers every ``GameError`` privately with that sentence (``bot.errors``), so a rule
broken deep in a query (a story ended while a button was clicked) reaches the player as a
refusal, never as "Something went wrong".
"""

from __future__ import annotations


class GameError(ValueError):
    """A player's action the game refuses; ``str()`` says why, in one sentence."""

    def __init__(self, reason: str, *args: object) -> None:
        super().__init__(reason, *args)  # args carry everything, so the exception pickles
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class StoryClosedError(GameError):
    """A turn or a member was added to a story that has ended (or is gone)."""

    def __init__(self, story_id: int) -> None:
        super().__init__("This story has ended; start a new one with /story start.", story_id)
        self.story_id = story_id


class TurnInFlightError(GameError):
    """A player already has a turn queued or running: one at a time, which the database enforces too."""

    def __init__(self, reason: str = "Your last turn is still being made; wait for it, or /cancel it.") -> None:
        super().__init__(reason)
