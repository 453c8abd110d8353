"""The HorizontalPodAutoscaler's rule (``serving.hpa``) against values worked out by hand from the Kubernetes
documentation's formula and the controller's stabilization, and the endpoint's exposition read back."""

from __future__ import annotations

import pytest

from serving.hpa import Reading, bounded, load, parse_reading, recommended, stabilized


@pytest.mark.parametrize("current, metric, target, expected", [
    (1, 3.0, 1.0, 3),     # ceil(1 x 3 / 1)
    (2, 1.5, 1.0, 3),     # ceil(2 x 1.5)
    (3, 0.2, 1.0, 1),     # ceil(3 x 0.2) = ceil(0.6)
    (3, 0.0, 1.0, 0),     # no load: 0, which min_replicas then raises
    (4, 1.09, 1.0, 4),    # within the 10 % tolerance: unchanged
    (4, 0.91, 1.0, 4),
    (4, 1.2, 1.0, 5),     # ceil(4.8)
    (3, 20.0, 30.0, 2),   # ceil(3 x 2/3) is 2, not 3 from a floating-point 2.0000000000000004
])
def test_the_recommendation_is_ceil_of_current_times_metric_over_target(current, metric, target, expected):
    assert recommended(current, metric, target) == expected


def test_a_target_not_above_zero_is_refused():
    with pytest.raises(ValueError):
        recommended(1, 1.0, 0)


def test_stabilization_rises_to_the_lowest_and_falls_to_the_highest_recommendation_of_its_window():
    history = [(100.0, 3), (110.0, 1), (125.0, 2)]
    # scale-up window 30 s at t=130: recommendations 3, 1, 2 and now 4 -> lowest 1: no rise above current 2
    assert stabilized(2, 4, history, 130.0, up_window=30, down_window=0) == 2
    # scale-up window 0: only the recommendation now counts
    assert stabilized(2, 4, history, 130.0, up_window=0, down_window=0) == 4
    # scale-down window 60 s: the highest of 3, 1, 2 and now 1 is 3: no fall below 3 from 3
    assert stabilized(3, 1, history, 130.0, up_window=0, down_window=60) == 3
    # once the 3 left the window (t=161, window 60 -> after 101), the highest is 2
    assert stabilized(3, 1, history, 161.0, up_window=0, down_window=60) == 2
    assert bounded(0, 1, 3) == 1 and bounded(5, 1, 3) == 3 and bounded(2, 1, 3) == 2


def test_the_load_is_the_mean_in_flight_or_the_rate_over_the_interval():
    before = Reading(requests=100, in_flight=0, in_flight_seconds=50.0, clock=1000.0)
    after = Reading(requests=160, in_flight=2, in_flight_seconds=80.0, clock=1010.0)
    assert load(after, before.as_sample(), "in_flight") == pytest.approx(3.0)  # 30 request-seconds over 10 s
    assert load(after, before.as_sample(), "rps") == pytest.approx(6.0)  # 60 requests over 10 s
    assert load(after, None, "in_flight") == 2 and load(after, None, "rps") is None
    restarted = Reading(requests=5, in_flight=1, in_flight_seconds=1.0, clock=3.0)  # the endpoint started again
    assert load(restarted, after.as_sample(), "in_flight") == 1 and load(restarted, after.as_sample(), "rps") is None


def test_a_reading_is_parsed_from_the_endpoint_exposition():
    text = ("# TYPE controlplane_endpoint_requests counter\ncontrolplane_endpoint_requests_total 12.0\n"
            "# TYPE controlplane_endpoint_in_flight gauge\ncontrolplane_endpoint_in_flight 2.0\n"
            "# TYPE controlplane_endpoint_in_flight_seconds counter\n"
            "controlplane_endpoint_in_flight_seconds_total 7.5\n"
            "# TYPE controlplane_endpoint_clock_seconds gauge\ncontrolplane_endpoint_clock_seconds 99.0\n")
    assert parse_reading(text) == Reading(12.0, 2.0, 7.5, 99.0)
    assert parse_reading("controlplane_endpoint_in_flight 2.0\n") is None
