"""The demo (``make demo``): seeds a local cluster, two teams and their limits, starts the platform's processes on
embedded defaults and submits example jobs through the REST API (``demo.run``; command ``manage.py demo``)."""
