"""``provider_user``: create or update a user of the test provider with exactly the given groups."""

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or update a user (password, email) and set its groups (repeat --group; none: no groups)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--email", default="")
        parser.add_argument("--group", action="append", default=[])

    def handle(self, *args, username, password, email, group, **options):
        user, _ = User.objects.get_or_create(username=username)
        if not user.check_password(password):  # a new hash would sign the user out at the provider
            user.set_password(password)
        user.email = email
        user.save()
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in group])
