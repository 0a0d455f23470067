"""tools/check_agreement.py on the tiny synthetic shape: the cpu target against itself agrees exactly, and
against the h200 plan (bf16, kernel emulations) it reports a finite KL and an agreement in [0, 1]."""

from __future__ import annotations

import json

from ember.tools import check_agreement


def _run(capsys, target: str) -> dict:
    assert check_agreement.main(["--shape", "qwen2-tiny", "--positions", "12", "--target", target]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_cpu_target_agrees_with_itself_exactly(capsys):
    result = _run(capsys, "cpu")
    assert result["top1_agreement"] == 1.0 and abs(result["mean_kl"]) < 1e-12


def test_the_h200_plan_reports_a_small_difference(capsys):
    result = _run(capsys, "h200")
    assert 0.0 <= result["top1_agreement"] <= 1.0
    assert 0.0 < result["mean_kl"] < 1e-2 and result["reference_median_top1_prob"] > 0


def _run_model(capsys, model, *flags: str) -> dict:
    assert check_agreement.main(["--model", str(model), "--positions", "16", "--target", "cpu", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_checkpoint_is_teacher_forced_on_the_passage_through_its_own_tokenizer(capsys, tiny_chat_model):
    """--model reads the passage through the checkpoint's tokenizer; --target-dtype runs the other side in
    bf16 (a real difference), and with --reference-dtype the same both sides agree exactly."""
    lower = _run_model(capsys, tiny_chat_model, "--target-dtype", "bfloat16")
    assert lower["positions"] == 16 and lower["tokens"] == "text: passage.txt"
    assert lower["reference"] == "cpu target, float32" and lower["target"] == "cpu, bfloat16"
    assert 0.0 < lower["mean_kl"] < 1e-2
    same = _run_model(capsys, tiny_chat_model, "--target-dtype", "bfloat16", "--reference-dtype", "bfloat16")
    assert same["top1_agreement"] == 1.0 and abs(same["mean_kl"]) < 1e-12


def test_the_int8_activation_modes_compute_the_kernels_references():
    """--int8-activations: "float" is the plain reference, "one" the integer-dot GEMV's (one int8 term), "two"
    its two-term form, much nearer the float result; formats the kernel lacks stay on the plain reference."""
    import jax.numpy as jnp
    import numpy as np

    from ember.compiler.kernels.gguf_gemv import pack, quant_matmul_ref, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.act_quant import dp4a_matmul_ref

    rng = np.random.default_rng(0)
    w = pack(random_gguf_bytes(rng, "q4_k", (64, 512), realistic=True), "q4_k", (64, 512))
    q8 = pack(random_gguf_bytes(rng, "q8_0", (64, 512)), "q8_0", (64, 512))
    x = jnp.asarray(rng.standard_normal((2, 512)).astype(np.float32))
    run = {mode: np.asarray(check_agreement.int8_activation_matmul(mode)(x, w)) for mode in ("float", "one", "two")}
    np.testing.assert_array_equal(run["float"], np.asarray(quant_matmul_ref(x, w)))
    np.testing.assert_array_equal(run["one"], np.asarray(dp4a_matmul_ref(x, w, terms=1)))
    errors = {mode: np.abs(run[mode] - run["float"]).max() for mode in ("one", "two")}
    assert errors["two"] < errors["one"] / 50
    np.testing.assert_array_equal(
        np.asarray(check_agreement.int8_activation_matmul("one")(x, q8)), np.asarray(quant_matmul_ref(x, q8))
    )
