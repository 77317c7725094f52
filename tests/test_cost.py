"""The cost model against hand-computed numbers and the reference recipe's one-cent estimate."""

from __future__ import annotations

import pytest

from trtllm_pipeline import cost
from trtllm_pipeline.errors import InputError


def test_cost_formulas_by_hand():
    # 2 GPUs at 3 USD/h serve 1,000 tokens/s: 6 USD buys 3.6 M tokens an hour
    est = cost.estimate(1000.0, gpus=2, gpu_hour_usd=3.0, request_output_tokens=500)
    assert est.deployment_hour_usd == 6.0
    assert est.usd_per_1m_output_tokens == pytest.approx(6.0 / 3.6)
    assert est.usd_per_request == pytest.approx(6.0 / 3600 * 0.5)  # 500 tokens take 0.5 s of the deployment
    assert est.requests_per_day == pytest.approx(1000 * 86400 / 500)
    d = est.to_dict()
    assert d["usd_per_1m_output_tokens"] == pytest.approx(1.6667, abs=1e-4)
    assert d["requests_per_day"] == 172800


def test_reference_recipe_one_cent_per_reasoning_request():
    # The recipe: ~1,700-token reasoning requests, ~90,000 a day per 4-GPU (TP=4) deployment, ~1 cent each.
    # 90,000 * 1,700 tokens a day is ~1,771 tokens/s; at the default price that is about a cent a request.
    throughput = 90_000 * cost.REFERENCE_REQUEST_TOKENS / cost.SECONDS_PER_DAY
    est = cost.estimate(throughput, gpus=4)
    assert est.requests_per_day == pytest.approx(90_000)
    assert est.usd_per_request == pytest.approx(0.01, rel=0.1)
    assert est.usd_per_1m_output_tokens == pytest.approx(est.usd_per_request / 1700 * 1e6)


def test_cost_scales_linearly_with_price_and_gpus():
    base = cost.estimate(500.0, gpus=1, gpu_hour_usd=2.0)
    assert cost.estimate(500.0, gpus=4, gpu_hour_usd=2.0).usd_per_request == pytest.approx(4 * base.usd_per_request)
    assert cost.estimate(500.0, gpus=1, gpu_hour_usd=5.0).usd_per_1m_output_tokens == pytest.approx(
        2.5 * base.usd_per_1m_output_tokens)
    assert cost.estimate(1000.0, gpus=1, gpu_hour_usd=2.0).requests_per_day == pytest.approx(2 * base.requests_per_day)


def test_nothing_measured_has_no_cost_rather_than_zero():
    assert cost.estimate(None, gpus=1) is None
    assert cost.estimate(0.0, gpus=1) is None


@pytest.mark.parametrize("kwargs", [{"gpu_hour_usd": 0.0}, {"gpu_hour_usd": -1.0}, {"gpus": 0},
                                    {"request_output_tokens": 0}])
def test_bad_inputs_are_input_errors(kwargs):
    with pytest.raises(InputError):
        cost.estimate(100.0, **{"gpus": 1, **kwargs})
