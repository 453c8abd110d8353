"""REST API of the quotas app: serializers, filter sets and viewsets mounted under /api/v1/."""
