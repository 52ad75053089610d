"""Pure game logic shared by servers, schedulers and policies (no I/O)."""
