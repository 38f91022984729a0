"""Loading the published AnimeGamer checkpoints (and tiny ones in the same layout) into our modules."""
