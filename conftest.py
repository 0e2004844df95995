"""Puts this checkout first on sys.path for pytest (so worktrees test their own code)."""
