"""The Discord bot: cogs for play, stories and admin, the delivery loop, cards."""
