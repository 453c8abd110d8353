"""A small OpenID Connect provider for the single sign-on tests: django-oauth-toolkit in its own Django project
(these settings, its own SQLite database), which ``tests.support.oidc`` runs as a separate process on 127.0.0.1.

Its ID tokens and userinfo answers carry ``preferred_username``, ``email``, the names, and ``groups``: the names of
the user's Django groups in this provider's database, which ``manage.py provider_user`` sets.
"""
