"""Autoscaled serving: the replica count of a serving job follows its endpoint's load, each added replica admitted
under the team's quota and budget (docs/adr/0041-autoscaled-serving.md)."""
