"""One package per feature area; each cog composes the mixins of its files."""
