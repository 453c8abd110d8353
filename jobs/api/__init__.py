"""REST API of the jobs app: serializers, filter sets and viewsets mounted under /api/v1/."""
