from vla_runtime.core.operator_reason import OperatorReason


def test_a_reason_is_fresh_once_and_for_a_minute():
    reason = OperatorReason(max_age_s=60.0)
    assert reason.take(0.0) is None
    reason.state("  cube  cleared\nfrom the table ", 10.0)
    assert reason.take(69.0) == "cube cleared from the table"
    assert reason.take(69.5) is None  # consumed by the first request
    reason.state("arm inspected", 100.0)
    assert reason.take(160.5) is None  # too old
    reason.state("arm inspected", 200.0)
    assert reason.take(199.0) is None  # stated after the request: a clock that went back
    reason.state("", 300.0)
    assert reason.take(300.0) is None  # blank withdraws
