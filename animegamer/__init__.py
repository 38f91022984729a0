"""AnimeGamer for Discord: settings and the command line that ties the rooms together."""
