"""fusion package."""
