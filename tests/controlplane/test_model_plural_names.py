"""Every model's plural name (the Django admin's headings and links) is English: "cluster metrics", not
"cluster metricss"; "cost entries", not "cost entrys"."""

from __future__ import annotations

from django.apps import apps

#: Apps whose models are the product's own.
PRODUCT_APPS = ("costs", "jobs", "notifications", "quotas", "runners", "frontend")
#: Nouns whose plural is the singular.
SAME_IN_PLURAL = ("metrics", "series")


def english_plural(singular: str) -> str:
    """The plural of a lower-case English noun phrase by its last word: s/x/z/ch/sh + es, consonant + y -> ies,
    nouns that are already plural unchanged, otherwise + s."""
    if singular.endswith(SAME_IN_PLURAL):
        return singular
    if singular.endswith(("s", "x", "z", "ch", "sh")):
        return singular + "es"
    if singular.endswith("y") and singular[-2:-1] not in "aeiou":
        return singular[:-1] + "ies"
    return singular + "s"


def test_every_models_plural_name_is_english():
    models = [m for m in apps.get_models() if m._meta.app_label in PRODUCT_APPS]
    assert len(models) > 30  # the rule reads every model, not a few
    wrong = {str(m._meta.verbose_name): str(m._meta.verbose_name_plural) for m in models
             if str(m._meta.verbose_name_plural) != english_plural(str(m._meta.verbose_name))}
    assert wrong == {}


def test_the_plural_rule_itself():
    assert english_plural("cluster metrics") == "cluster metrics"
    assert english_plural("allocation series") == "allocation series"
    assert english_plural("ledger discrepancy") == "ledger discrepancies"
    assert english_plural("priority class") == "priority classes"
    assert english_plural("API token") == "API tokens" and english_plural("job attempt") == "job attempts"
