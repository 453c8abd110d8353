"""The Django project itself: health probes, the API schema, and the settings read from the environment."""
