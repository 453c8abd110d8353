"""The sign-in page and the single sign-on endpoints of the web UI (ADR 0032).

``/login/`` is Django's password form, plus a "Sign in with <provider>" button when single sign-on is configured.
``/oidc/authenticate/`` sends the browser to the provider (mozilla-django-oidc: state, nonce and PKCE verifier kept
server-side for this browser) and ``/oidc/callback/`` takes it back: a callback whose state this browser was not
given is refused (400), one whose token or claims fail ``quotas.oidc.OidcBackend``'s checks goes back to the
sign-in page with a message. Both answer 404 while single sign-on is off.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import LoginView
from django.http import Http404
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from quotas import oidc

#: What the sign-in page says after a refused or failed single sign-on.
SSO_FAILED = "Single sign-on did not sign you in. Try again, or ask a platform administrator."


class SignInView(LoginView):
    """The sign-in page: the username and password form, and the single sign-on button when it is configured."""

    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["sso_provider"] = oidc.provider_name() if oidc.enabled() else None
        return context


class SsoStartView(OIDCAuthenticationRequestView):
    """GET ``/oidc/authenticate/?next=<path>``: redirect to the provider's authorization endpoint; 404 while off."""

    def __init__(self, *args, **kwargs):
        if not oidc.enabled():
            raise Http404("single sign-on is not configured")
        super().__init__(*args, **kwargs)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """GET ``/oidc/callback/?code=...&state=...``: sign the user in, or back to the sign-in page; 404 while off."""

    def get(self, request):
        if not oidc.enabled():
            raise Http404("single sign-on is not configured")
        return super().get(request)

    def login_failure(self):
        messages.error(self.request, SSO_FAILED)
        return super().login_failure()
