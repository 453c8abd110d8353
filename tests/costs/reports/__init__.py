"""Cost reports: their numbers, renderings and schedules."""
