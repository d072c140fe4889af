"""Graph clean-up passes run before lowering. Each is a pure function Graph -> Graph."""
