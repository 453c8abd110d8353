"""The pure scheduling core (no database): admission checks, fair share, preemption, and its properties."""
