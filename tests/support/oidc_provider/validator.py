"""The claims the test provider releases: the standard ones the control plane reads, and ``groups``."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """django-oauth-toolkit's validator with ``preferred_username``, ``email``, names and ``groups`` (the user's
    Django group names, sorted) in the ID token and the userinfo answer."""

    # Claims missing from this map are never released; groups come with the openid scope.
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
