"""The memory-fit advisor (booking/fit.py), checked against figures worked out by hand in the comments.

GB = 10^9 bytes throughout; P billion parameters × B bytes = P·B GB. Verdicts: fits ≤ 85 % of a card, tight ≤ 100 %:
H200 141 GB → fits up to 119.85 GB; B200 180 GB → 153 GB; MI300X 192 GB → 163.2 GB. No database needed.
"""

import math
import subprocess
import sys

import pytest

from booking.fit import (
    ADAFACTOR_STATE_EQUIVALENTS,
    RECOMMENDATIONS,
    FitInput,
    Mode,
    Optimizer,
    Precision,
    Verdict,
    memory_data_parallel,
    memory_sharded,
    memory_single_card,
    verdict,
)
from booking.fit_advice import advise, class_fit

approx = pytest.approx


TRAINING = {
    "mode": Mode.TRAINING,
    "weight_precision": Precision.BF16,
    "optimizer_precision": Precision.FP32,
    "optimizer": Optimizer.ADAMW,
}


def training(parameters_billion: float, **overrides) -> FitInput:
    """Mixed-precision AdamW training: bf16 weights and gradients, fp32 states and master weights."""
    return FitInput(**({"parameters_billion": parameters_billion, **TRAINING} | overrides))


def inference(parameters_billion: float, **overrides) -> FitInput:
    fields = {
        "parameters_billion": parameters_billion,
        "mode": Mode.INFERENCE,
        "weight_precision": Precision.BF16,
        "optimizer_precision": Precision.FP32,
        "optimizer": Optimizer.NONE,
    }
    return FitInput(**(fields | overrides))


def option(advice, hardware_keyword: str, name: str):
    fit = next(fit for fit in advice.fits if hardware_keyword in fit.hardware)
    return fit.option(name)


# --- (a) 7B, mixed-precision AdamW training ---------------------------------------------------------------------

# Llama-2-7B-like shape: micro-batch 1, sequence 2048, hidden 4096, 32 layers, head_dim 128.
SEVEN_B = {"batch": 1, "sequence": 2048, "hidden": 4096, "layers": 32, "head_dim": 128}
# Activations (Korthikanti eq. 1), per layer: s·b·h·(34 + 5·s/head_dim)
#   = 2048·1·4096 · (34 + 5·2048/128) = 8,388,608 · (34 + 80) = 8,388,608 · 114 = 956,301,312 bytes
#   × 32 layers = 30,601,641,984 bytes = 30.601641984 GB
SEVEN_B_ACTIVATIONS = 30.601641984


def test_7b_mixed_precision_adamw_keeps_16_bytes_per_parameter_and_does_not_fit_one_h200():
    breakdown = memory_single_card(training(7, **SEVEN_B))

    # ZeRO: 2 (bf16 weights) + 2 (bf16 grads) + 12 (fp32 master 4 + momentum 4 + variance 4) = 16 bytes/param
    assert breakdown.weights_gb == approx(14.0)  # 7 × 2
    assert breakdown.gradients_gb == approx(14.0)  # 7 × 2
    assert breakdown.optimizer_gb == approx(84.0)  # 7 × (4 + 4 + 4)
    assert breakdown.weights_gb + breakdown.gradients_gb + breakdown.optimizer_gb == approx(112.0)  # 7 × 16
    assert breakdown.activations_gb == approx(SEVEN_B_ACTIVATIONS)
    assert breakdown.kv_cache_gb == 0.0
    # subtotal 112 + 30.601641984 = 142.601641984; reserve 10 % = 14.2601641984; total 156.8618061824
    assert breakdown.reserve_gb == approx(14.2601641984)
    assert breakdown.total_gb == approx(156.8618061824)
    # one H200 (141 GB): 156.86 > 141 → does not fit; one B200: 153 < 156.86 ≤ 180 → tight;
    # one MI300X: 156.86 ≤ 163.2 → fits
    assert verdict(total_gb=breakdown.total_gb, card_gb=141) is Verdict.DOES_NOT_FIT
    assert verdict(total_gb=breakdown.total_gb, card_gb=180) is Verdict.TIGHT
    assert verdict(total_gb=breakdown.total_gb, card_gb=192) is Verdict.FITS


def test_7b_sharded_over_a_pair_holds_56_gb_of_states_per_card_plus_all_its_activations():
    breakdown = memory_sharded(training(7, **SEVEN_B), cards=2)

    # 112 GB of states / 2 cards = 56 GB per card: weights 7, grads 7, optimizer 42
    assert (breakdown.weights_gb, breakdown.gradients_gb, breakdown.optimizer_gb) == approx((7.0, 7.0, 42.0))
    # activations are not divided by sharding: still 30.601641984 GB on each card
    assert breakdown.activations_gb == approx(SEVEN_B_ACTIVATIONS)
    # subtotal 56 + 30.601641984 = 86.601641984; reserve 8.6601641984; total 95.2618061824
    assert breakdown.total_gb == approx(95.2618061824)
    # H200: 95.26 ≤ 119.85 → fits; B200: ≤ 153 → fits
    assert verdict(total_gb=breakdown.total_gb, card_gb=141) is Verdict.FITS


def test_7b_advice_is_the_sharded_b200_pair_and_mentions_one_mi300x_card_only_to_a_rocm_project():
    advice = advise(training(7, **SEVEN_B), rocm_ready=True)

    # H200 single does not fit, B200 single only tight, B200 sharded fits → b200_pair_sharded
    assert advice.recommendation == "b200_pair_sharded"
    assert option(advice, "H200", "single_card").verdict is Verdict.DOES_NOT_FIT
    assert option(advice, "B200", "single_card").verdict is Verdict.TIGHT
    assert option(advice, "B200", "sharded_pair").verdict is Verdict.FITS
    assert option(advice, "MI300X", "single_card").verdict is Verdict.FITS
    assert any("One card of the AMD MI300X pair would also fit" in reason for reason in advice.reasons)
    assert advice.reasons[0].startswith("Estimate per card, in GB of 10^9 bytes")
    # A CUDA project is not sent to AMD for memory alone.
    cuda_project = advise(training(7, **SEVEN_B))
    assert cuda_project.recommendation == "b200_pair_sharded"
    assert not any("MI300X pair would also fit" in reason for reason in cuda_project.reasons)


def test_full_checkpointing_keeps_a_fraction_of_the_activations_and_brings_7b_within_one_h200():
    breakdown = memory_single_card(training(7, checkpointing_factor=0.2, **SEVEN_B))

    # activations 30.601641984 × 0.2 = 6.1203283968; subtotal 118.1203283968; × 1.1 = 129.93236123648
    assert breakdown.activations_gb == approx(6.1203283968)
    assert breakdown.total_gb == approx(129.93236123648)
    # 119.85 < 129.93 ≤ 141 → tight on an H200
    assert verdict(total_gb=breakdown.total_gb, card_gb=141) is Verdict.TIGHT


def test_activations_assume_head_dim_128_when_not_given_and_double_for_fp32():
    shape = {key: value for key, value in SEVEN_B.items() if key != "head_dim"}
    advice = advise(training(7, **shape))
    assert advice.fits[0].options[0].breakdown.activations_gb == approx(SEVEN_B_ACTIVATIONS)
    assert any("head dimension of 128" in reason for reason in advice.reasons)

    # fp32 activations: 4-byte values instead of 2, so twice the 16-bit figure
    fp32 = memory_single_card(training(7, weight_precision=Precision.FP32, **SEVEN_B))
    assert fp32.activations_gb == approx(2 * SEVEN_B_ACTIVATIONS)
    # fp32 weights keep no separate master copy: optimizer = 7 × (4 + 4) = 56, weights 28, grads 28
    assert (fp32.weights_gb, fp32.gradients_gb, fp32.optimizer_gb) == approx((28.0, 28.0, 56.0))


def test_a_direct_activation_figure_is_used_as_given():
    breakdown = memory_single_card(training(7, activations_gb=12.5, checkpointing_factor=0.5))
    # a measurement already includes any checkpointing: 12.5, not 6.25
    assert breakdown.activations_gb == 12.5
    # 112 + 12.5 = 124.5; × 1.1 = 136.95
    assert breakdown.total_gb == approx(136.95)


def test_training_without_any_activation_figure_says_the_total_is_a_lower_bound():
    advice = advise(training(7))
    assert advice.fits[0].options[0].breakdown.activations_gb == 0.0
    assert any("lower bound" in reason for reason in advice.reasons)


# --- (b) 70B bf16 inference -------------------------------------------------------------------------------------

# Llama-2/3-70B-like shape: 80 layers, hidden 8192, 8 KV heads (grouped-query), head_dim 128; batch 8 × 4096 tokens.
SEVENTY_B = {"batch": 8, "sequence": 4096, "hidden": 8192, "layers": 80, "kv_heads": 8, "head_dim": 128}
# KV cache: 2 · layers · kv_heads · head_dim · seq · batch · bytes = 2 · 80 · 8 · 128 · 4096 · 8 · 2
#   = 163,840 · 4096 = 671,088,640; · 8 = 5,368,709,120; · 2 bytes = 10,737,418,240 bytes = 10.73741824 GB
SEVENTY_B_KV = 10.73741824


def test_70b_bf16_weights_alone_plus_reserve_overflow_one_h200():
    breakdown = memory_single_card(inference(70))
    # 70 × 2 = 140 GB of weights, + 10 % = 154 GB > 141 → does not fit one H200
    assert breakdown.weights_gb == approx(140.0)
    assert breakdown.total_gb == approx(154.0)
    assert verdict(total_gb=breakdown.total_gb, card_gb=141) is Verdict.DOES_NOT_FIT


def test_70b_bf16_inference_on_one_b200_and_sharded_over_a_pair():
    single = memory_single_card(inference(70, **SEVENTY_B))
    assert single.kv_cache_gb == approx(SEVENTY_B_KV)
    assert (single.gradients_gb, single.optimizer_gb, single.activations_gb) == (0.0, 0.0, 0.0)
    # one card: 140 + 10.73741824 = 150.73741824; × 1.1 = 165.811160064
    # B200: 153 < 165.81 ≤ 180 → tight; MI300X: 163.2 < 165.81 ≤ 192 → tight
    assert single.total_gb == approx(165.811160064)
    assert verdict(total_gb=single.total_gb, card_gb=180) is Verdict.TIGHT

    sharded = memory_sharded(inference(70, **SEVENTY_B), cards=2)
    # 70 GB of weights per card; the KV cache stays whole on each card: 70 + 10.73741824 = 80.73741824
    # × 1.1 = 88.811160064 → fits a B200 (≤ 153) and even an H200 (≤ 119.85)
    assert sharded.weights_gb == approx(70.0)
    assert sharded.kv_cache_gb == approx(SEVENTY_B_KV)
    assert sharded.total_gb == approx(88.811160064)
    assert verdict(total_gb=sharded.total_gb, card_gb=180) is Verdict.FITS
    assert verdict(total_gb=sharded.total_gb, card_gb=141) is Verdict.FITS


def test_70b_inference_advice_is_the_sharded_b200_pair_and_says_the_optimizer_is_ignored():
    advice = advise(inference(70, optimizer=Optimizer.ADAMW, **SEVENTY_B), hypothesis="make_possible")

    assert advice.recommendation == "b200_pair_sharded"
    assert option(advice, "H200", "single_card").verdict is Verdict.DOES_NOT_FIT
    assert option(advice, "B200", "single_card").verdict is Verdict.TIGHT
    assert option(advice, "B200", "sharded_pair").breakdown.total_gb == approx(88.811160064)
    # the optimizer changes nothing in inference, and the reasons say it was ignored
    assert advice.fits[0].options[0].breakdown.optimizer_gb == 0.0
    assert any("optimizer (adamw) is ignored" in reason for reason in advice.reasons)
    assert advice.hypothesis_advice.startswith("Shard the weights, gradients and optimizer states over both cards")
    assert "88.8 GB per card instead of 165.8 GB" in advice.hypothesis_advice


def test_the_direct_kv_figure_wins_and_training_ignores_the_kv_cache():
    assert memory_single_card(inference(70, kv_cache_gb=5.0, **SEVENTY_B)).kv_cache_gb == 5.0
    advice = advise(training(7, kv_cache_gb=5.0, activations_gb=0.0))
    assert advice.fits[0].options[0].breakdown.kv_cache_gb == 0.0
    assert any("the KV cache is ignored" in reason for reason in advice.reasons)


def test_inference_keeps_no_activations_from_the_shape():
    # nothing is kept for a backward pass; only a measured figure counts
    assert memory_single_card(inference(70, **SEVENTY_B)).activations_gb == 0.0
    assert memory_single_card(inference(70, activations_gb=3.0, **SEVENTY_B)).activations_gb == 3.0


# --- (c) a small model --------------------------------------------------------------------------------------------


def test_a_1b_model_fits_one_h200_card():
    advice = advise(training(1, activations_gb=10.0))
    # 1 × 16 = 16 GB of states + 10 GB of activations = 26; × 1.1 = 28.6 ≤ 119.85 → fits one H200
    assert option(advice, "H200", "single_card").breakdown.total_gb == approx(28.6)
    assert advice.recommendation == "one_h200_enough"
    assert advice.hypothesis_advice is None

    assert advise(inference(1)).recommendation == "one_h200_enough"  # 2 GB × 1.1 = 2.2 GB


def test_a_model_for_one_b200_but_not_one_h200_gets_b200_single_card():
    # inference, 65B bf16, no reserve: 130 GB. H200: 119.85 < 130 ≤ 141 → tight (not enough); B200: ≤ 153 → fits
    advice = advise(inference(65, reserve_fraction=0.0))
    assert option(advice, "H200", "single_card").verdict is Verdict.TIGHT
    assert advice.recommendation == "b200_single_card"


def test_a_model_only_the_mi300x_pair_holds_sharded_is_sent_there_only_when_the_project_runs_on_rocm():
    # inference, 185B bf16, no reserve: 370 GB; sharded 185 GB per card: B200 180 → does not fit; MI300X: 163.2 <
    # 185 ≤ 192 → tight
    advice = advise(inference(185, reserve_fraction=0.0), rocm_ready=True)
    assert option(advice, "B200", "sharded_pair").verdict is Verdict.DOES_NOT_FIT
    assert option(advice, "MI300X", "sharded_pair").verdict is Verdict.TIGHT
    assert advice.recommendation == "mi300x_pair_sharded"

    cuda_project = advise(inference(185, reserve_fraction=0.0))
    assert cuda_project.recommendation == "does_not_fit"
    assert any("would hold it sharded, for a project that already runs on ROCm" in r for r in cuda_project.reasons)


def test_a_model_too_big_even_sharded_does_not_fit_and_says_so():
    # training 100B: 1600 GB of states / 2 = 800 GB per card
    advice = advise(training(100, activations_gb=0.0), hypothesis="bigger_batch")
    assert advice.recommendation == "does_not_fit"
    assert advice.hypothesis_advice.startswith("The model does not fit, not even sharded over the NVIDIA B200 pair")
    assert set(RECOMMENDATIONS) >= {"one_h200_enough", "b200_single_card", "b200_pair_sharded", "does_not_fit"}


# --- (d) hypothesis-aware advice -------------------------------------------------------------------------------


def test_compare_hyperparameters_suggests_two_independent_single_card_experiments():
    advice = advise(training(1, activations_gb=10.0), hypothesis="compare_hyperparameters")
    assert advice.hypothesis_advice == (
        "Run two independent single-card experiments on the NVIDIA H200 pair, one configuration per card, rather "
        "than one distributed run: each needs 28.6 GB of a 141.0 GB card, nothing is exchanged between the cards, "
        "and each window gives two comparable results."
    )


def test_compare_hyperparameters_when_one_configuration_needs_the_whole_pair():
    advice = advise(training(7, **SEVEN_B), hypothesis="compare_hyperparameters")
    assert "cannot run side by side" in advice.hypothesis_advice
    assert "95.3 GB per card" in advice.hypothesis_advice


def test_bigger_batch_and_shorter_step_use_data_parallelism_when_one_card_fits_else_sharding():
    small = training(1, activations_gb=10.0)
    bigger = advise(small, hypothesis="bigger_batch").hypothesis_advice
    assert bigger.startswith("Use data parallelism on the NVIDIA H200 pair: each card holds a full copy (28.6 GB")
    assert "a global batch twice as big, not more memory" in bigger
    shorter = advise(small, hypothesis="shorter_step").hypothesis_advice
    assert "a shorter step at the same batch" in shorter

    large = advise(training(7, **SEVEN_B), hypothesis="bigger_batch").hypothesis_advice
    assert large.startswith("One card is not enough, so shard over both cards of the NVIDIA B200 pair")


def test_make_possible_on_a_model_that_already_fits_one_card_says_the_pair_is_not_needed():
    advice = advise(training(1, activations_gb=10.0), hypothesis="make_possible")
    assert "the pair is not needed to make the run possible" in advice.hypothesis_advice


def test_other_hypothesis_gives_no_specific_advice_and_unknown_codes_are_refused():
    assert advise(training(1), hypothesis="other").hypothesis_advice is None
    with pytest.raises(ValueError, match="hypothesis must be one of"):
        advise(training(1), hypothesis="faster")


# --- (e) a pair is two cards, never one 360 GB allocation -----------------------------------------------------------


def test_a_250_gb_per_card_model_does_not_fit_a_data_parallel_pair_although_250_is_below_360():
    # inference, 125B bf16, no reserve: 125 × 2 = 250 GB on each card of a data-parallel pair (a full copy each)
    model = inference(125, reserve_fraction=0.0)
    assert memory_data_parallel(model, cards=2).total_gb == approx(250.0)
    advice = advise(model)
    for fit in advice.fits:
        # 250 > 180, 141, 192 per card, although 250 < 2 × 180 = 360 and < 2 × 192 = 384
        assert fit.option("data_parallel_pair").verdict is Verdict.DOES_NOT_FIT
        assert fit.option("data_parallel_pair").breakdown.total_gb == approx(250.0)
    # sharded: 125 GB per card → B200 fits (≤ 153), H200 tight (119.85 < 125 ≤ 141)
    assert option(advice, "B200", "sharded_pair").verdict is Verdict.FITS
    assert option(advice, "H200", "sharded_pair").verdict is Verdict.TIGHT
    assert advice.recommendation == "b200_pair_sharded"
    assert any("never one allocation of twice the memory" in reason for reason in advice.reasons)


def test_data_parallel_saves_no_memory_and_sharding_never_divides_activations_or_kv():
    for model in (training(7, **SEVEN_B), inference(70, **SEVENTY_B)):
        single = memory_single_card(model)
        for cards in (2, 4, 8):
            assert memory_data_parallel(model, cards=cards) == single
            sharded = memory_sharded(model, cards=cards)
            assert sharded.activations_gb == single.activations_gb
            assert sharded.kv_cache_gb == single.kv_cache_gb
            assert sharded.weights_gb == approx(single.weights_gb / cards)


def test_a_one_card_class_offers_only_the_single_card_option():
    fit = class_fit(training(1), hardware="one H200", card_gb=141, cards=1)
    assert [o.name for o in fit.options] == ["single_card"]


# --- (f) validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parameters_billion": 0}, "parameters_billion must be above 0"),
        ({"parameters_billion": -7}, "parameters_billion must be above 0"),
        ({"parameters_billion": 10_001}, "up to 10000"),
        ({"parameters_billion": math.nan}, "parameters_billion must be a finite number"),
        ({"parameters_billion": math.inf}, "parameters_billion must be a finite number"),
        ({"parameters_billion": True}, "parameters_billion must be a finite number"),
        ({"parameters_billion": "7"}, "parameters_billion must be a finite number"),
        ({"batch": 0, "sequence": 1, "hidden": 1, "layers": 1}, "batch must be from 1"),
        ({"batch": 1, "sequence": 10**7 + 1, "hidden": 1, "layers": 1}, "sequence must be from 1 up to 10,000,000"),
        ({"batch": 1, "sequence": 1, "hidden": 2.5, "layers": 1}, "hidden must be a whole number"),
        ({"batch": 1, "sequence": 1, "hidden": 1, "layers": -3}, "layers must be from 1"),
        ({"batch": 8, "sequence": 4096}, "needs all of batch, sequence, hidden and layers; missing: hidden, layers"),
        ({"head_dim": 0}, "head_dim must be from 1"),
        ({"kv_heads": 8}, "kv_heads needs head_dim"),
        ({"reserve_fraction": 0.6}, "reserve_fraction must be from 0 up to 0.5"),
        ({"reserve_fraction": -0.1}, "reserve_fraction must be from 0 up to 0.5"),
        ({"checkpointing_factor": 0.0}, "checkpointing_factor must be from 0.01 up to 1"),
        ({"checkpointing_factor": 1.5}, "checkpointing_factor must be from 0.01 up to 1"),
        ({"activations_gb": -1.0}, "activations_gb must be from 0"),
        ({"kv_cache_gb": math.nan}, "kv_cache_gb must be a finite number"),
        ({"mode": "pretraining"}, "mode must be one of training, inference; got 'pretraining'"),
        ({"weight_precision": "int4"}, "weight_precision must be one of fp32, bf16, fp8"),
        ({"optimizer": "lion"}, "optimizer must be one of adamw, sgd_momentum, adafactor, none"),
        ({"master_weights": "yes"}, "master_weights must be True or False"),
    ],
)
def test_absurd_or_inconsistent_input_is_refused_with_a_clear_message(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        FitInput(**({"parameters_billion": 7, **TRAINING} | overrides))


def test_kv_heads_in_inference_need_the_shape():
    with pytest.raises(ValueError, match="also needs layers, sequence and batch"):
        inference(70, kv_heads=8, head_dim=128)


def test_the_limits_themselves_are_accepted_and_strings_become_enums():
    model = training(
        10_000, reserve_fraction=0.5, checkpointing_factor=0.01, batch=10**7, sequence=1, hidden=1, layers=1
    )
    assert model.parameters_billion == 10_000
    named = FitInput(
        parameters_billion=1, mode="inference", weight_precision="fp8", optimizer_precision="bf16", optimizer="none"
    )
    assert named.mode is Mode.INFERENCE and named.weight_precision is Precision.FP8


def test_cards_verdict_and_hardware_are_checked():
    with pytest.raises(ValueError, match="cards must be a whole number from 1"):
        memory_sharded(training(7), cards=0)
    with pytest.raises(ValueError, match="cards must be a whole number from 1"):
        memory_data_parallel(training(7), cards=True)
    with pytest.raises(ValueError, match="card_gb must be above 0"):
        verdict(total_gb=10, card_gb=0)
    with pytest.raises(ValueError, match="total_gb must be from 0"):
        verdict(total_gb=-1, card_gb=141)
    with pytest.raises(ValueError, match="hardware must list at least one class"):
        advise(training(7), hardware=[])


def test_verdict_boundaries():
    assert verdict(total_gb=85, card_gb=100) is Verdict.FITS  # exactly 85 %
    assert verdict(total_gb=85.01, card_gb=100) is Verdict.TIGHT
    assert verdict(total_gb=100, card_gb=100) is Verdict.TIGHT  # exactly the card
    assert verdict(total_gb=100.01, card_gb=100) is Verdict.DOES_NOT_FIT
    assert verdict(total_gb=153, card_gb=180) is Verdict.FITS  # 0.85 × 180 = 153
    assert verdict(total_gb=119.85, card_gb=141) is Verdict.FITS  # 0.85 × 141 = 119.85


# --- (g) precisions and optimizers -------------------------------------------------------------------------------


def test_fp8_weights_halve_bf16_weight_memory():
    # 70 × 1 = 70 GB in fp8 against 70 × 2 = 140 GB in bf16
    assert memory_single_card(inference(70, weight_precision=Precision.FP8)).weights_gb == approx(70.0)
    assert memory_single_card(inference(70)).weights_gb == approx(140.0)
    # fp8 training keeps 16-bit gradients: 10 × 2 = 20 GB, not 10
    assert memory_single_card(training(10, weight_precision=Precision.FP8)).gradients_gb == approx(20.0)
    # the fp8 KV cache stores 1 byte per value: half the bf16 figure
    fp8 = memory_single_card(inference(70, weight_precision=Precision.FP8, **SEVENTY_B))
    assert fp8.kv_cache_gb == approx(SEVENTY_B_KV / 2)


@pytest.mark.parametrize(
    ("optimizer", "states", "gb"),
    [
        # 10B parameters, fp32 states, no master weights: 10 × states × 4 bytes
        (Optimizer.ADAMW, 2, 80.0),  # momentum + variance
        (Optimizer.SGD_MOMENTUM, 1, 40.0),  # momentum
        (Optimizer.ADAFACTOR, 0.5, 20.0),  # factored second moment: 0.5 state-equivalent (documented allowance)
        (Optimizer.NONE, 0, 0.0),
    ],
)
def test_optimizer_states(optimizer, states, gb):
    assert optimizer.states == states
    model = training(10, optimizer=optimizer, master_weights=False)
    assert memory_single_card(model).optimizer_gb == approx(gb)
    # bf16 states take half: 10 × states × 2
    model = training(10, optimizer=optimizer, optimizer_precision=Precision.BF16, master_weights=False)
    assert memory_single_card(model).optimizer_gb == approx(gb / 2)


def test_adafactor_allowance_and_master_weights_add_up():
    assert ADAFACTOR_STATE_EQUIVALENTS == 0.5
    # bf16 weights with master weights: + 10 × 4 = 40 GB on top of Adafactor's 10 × 0.5 × 4 = 20 GB
    assert memory_single_card(training(10, optimizer=Optimizer.ADAFACTOR)).optimizer_gb == approx(60.0)
    # inference: no gradients, no optimizer, no master weights whatever the optimizer field says
    served = memory_single_card(inference(10, optimizer=Optimizer.SGD_MOMENTUM))
    assert (served.gradients_gb, served.optimizer_gb) == (0.0, 0.0)


# --- the module stays pure Python --------------------------------------------------------------------------------


def test_the_advisor_imports_no_django():
    code = "import sys, booking.fit; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_direct_activation_figure_next_to_a_shape_is_said_to_win():
    advice = advise(inference(70, activations_gb=3.0, **SEVENTY_B))
    assert any("activation shape served only for the KV cache" in reason for reason in advice.reasons)
    advice = advise(training(7, activations_gb=3.0, **SEVEN_B))
    assert any("activation shape was not needed" in reason for reason in advice.reasons)
