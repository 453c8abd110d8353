"""The demo (``manage.py demo``): its setup and the end-to-end run with real workers."""
