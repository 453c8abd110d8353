"""REST API of the runners app: serializers, filter sets and viewsets mounted under /api/v1/."""
