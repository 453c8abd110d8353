"""REST API of the costs app: serializers, filter sets and viewsets mounted under /api/v1/."""
