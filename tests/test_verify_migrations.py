"""Pairs of (original, careless migration), each failing verify with its own message and
line, beside the correct migration of the same script, which passes. (The per-rank log and
the `module.` keys are in test_verify_outputs.py, the missing set_epoch in test_verify.py.)"""

from __future__ import annotations

import pytest

from dp2ddp.verify import report
from tests.verify_helpers import fixture, verify

pytestmark = pytest.mark.torchrun


def _problems(rep) -> str:
    return "\n".join(rep["problems"])


def test_an_unsharded_loader_fails_with_its_line(tmp_path):
    """Every rank reads the whole dataset in the original's batches: the migration does
    twice the work. Named with the loader's variable and line, in text, JSON and caption;
    the global batch finding says to shard first, not to halve the batch."""
    code, rep, out, _ = verify(tmp_path, fixture("writer.py"), "--migrated", fixture("writer_unsharded_ddp.py"),
                               "--steps", "0", "--no-envelope")
    assert code == 1, out
    unsharded = ("rank 0 and rank 1 each served all 256 samples of `loader` (fixtures/verify/writer_unsharded_ddp.py:55) "
                 "in epoch 0: the loader is not sharded, every rank does the whole epoch's work")
    assert unsharded in rep["problems"] and unsharded in out
    assert unsharded in report.caption(rep, width=10_000)
    assert rep["data"]["unsharded"] is True
    (loader,) = rep["data"]["loaders"]
    assert loader["site"] == "fixtures/verify/writer_unsharded_ddp.py:55" and loader["epochs"][0]["served"] == [256, 256]
    batch = next(p for p in rep["problems"] if "the global batch differs" in p)
    assert "the loader is not sharded (above): shard it first" in batch


def test_runtime_sharding_passes_with_the_originals_order(tmp_path):
    """The migration as `dp2ddp rewrite` now shards it (shard_loader / ShardedBatches,
    inline): the original's loader draws the same batches, the losses agree within the
    noise envelope over two epochs, the shards are disjoint and cover each epoch, and each
    epoch has a new order."""
    code, rep, out, _ = verify(tmp_path, fixture("writer.py"), "--migrated", fixture("writer_sharded_ddp.py"), "--steps", "0")
    assert code == 0, out
    assert rep["losses_agree"] and rep["max_rel_loss_diff"] < 1e-5 and rep["tolerance"]["kind"] == "envelope"
    (loader,) = rep["data"]["loaders"]
    assert loader["sampler"] == "ShardedBatches" and loader["order"] == "new each epoch"
    assert [(e["union"], e["extra_servings"], e["lost"], e["added"]) for e in loader["epochs"]] == [(256, 0, 0, 0)] * 2
    assert rep["outputs"]["equal"] is True


def test_a_pickled_ddp_wrapper_fails_where_the_bare_model_passes(tmp_path):
    code, rep, out, _ = verify(tmp_path, fixture("pickler.py"), "--migrated", fixture("pickler_wrapper_ddp.py"),
                               "--steps", "0", "--no-envelope")
    assert code == 1, out
    (d,) = rep["outputs"]["differences"]
    assert d["kind"] == "wrapper" and d["message"].startswith(
        "ckpt.pt pickles the DistributedDataParallel wrapper (saved at fixtures/verify/pickler_wrapper_ddp.py:33)")
    assert "Default process group has not been initialized" in d["message"] and "\x1b[" not in d["message"]
    assert rep["losses_agree"] and rep["replicas_in_sync"]  # it trains right: only the checkpoint is wrong

    code, rep, out, _ = verify(tmp_path, fixture("pickler.py"), "--migrated", fixture("pickler_ddp.py"),
                               "--steps", "0", "--no-envelope")
    assert code == 0, out
    (f,) = rep["outputs"]["files"]
    assert (f["path"], f["kind"], f["status"]) == ("ckpt.pt", "checkpoint", "equal")
    assert f["original"]["load"] == f["migrated"]["load"] == "full"  # a pickled module: weights_only=False on both sides


def test_every_optimizer_of_a_gan_in_folds_is_followed(tmp_path):
    """A discriminator and a generator (with a scheduler), a new pair per fold: four
    optimizers, each compared step by step. The migration that scales the second fold's
    generator's learning rate by the world size fails on that optimizer, at its line."""
    code, rep, out, _ = verify(tmp_path, fixture("gan.py"), "--steps", "0")
    assert code == 0, out
    opts = rep["optimizers"]
    assert [(o["index"], o["kind"], o["steps"]["original"], o["steps"]["migrated"]) for o in opts] == [
        (0, "Adam", 16, 16), (1, "Adam", 16, 16), (2, "Adam", 16, 16), (3, "Adam", 16, 16)]
    assert all(o["worst_ratio"] <= 1 for o in opts)

    code, rep, out, _ = verify(tmp_path, fixture("gan.py"), "--migrated", fixture("gan_lr_scaled_ddp.py"), "--steps", "0")
    assert code == 1, out
    assert ("the learning rate of optimizer 3 (Adam, fixtures/verify/gan_lr_scaled_ddp.py:22) differs from step 1: "
            "original 0.001, migrated 0.002") in _problems(rep)
    assert not any("optimizer 0 " in p or "optimizer 1 " in p for p in rep["problems"])  # the first fold trains as before


def test_a_long_run_drifts_past_a_fixed_tolerance_and_stays_within_its_envelope(tmp_path):
    """A small CNN (ReLU, max-pooling, SGD with momentum) for 150 steps: float reordering
    alone takes the migration well past 1e-4 relative, and the envelope measured for it
    says that is noise."""
    code, rep, out, _ = verify(tmp_path, fixture("cnn_long.py"), "--steps", "150")
    assert code == 0, out
    assert rep["steps_compared"] == 150
    assert rep["max_rel_loss_diff"] > 1e-4  # the old fixed --rtol 1e-4 would have failed it
    tol = rep["tolerance"]
    assert tol["kind"] == "envelope" and tol["method"] == "chunks" and tol["worst_ratio"] <= 1


def test_augmentation_in_the_dataset_is_the_same_whichever_rank_fetches_the_item(tmp_path):
    """A dataset that draws a crop, a flip and jitter per item from `random`, NumPy and
    torch: the probe makes each item with the streams seeded by (seed, dataset, pass,
    index), so the rank that owns item 5 makes the same item 5 as the original's one
    process; the losses agree within the float-noise envelope, not just statistically."""
    code, rep, out, _ = verify(tmp_path, fixture("augmented.py"), "--steps", "0")
    assert code == 0, out
    assert rep["tolerance"]["kind"] == "envelope" and rep["losses_agree"] and rep["max_rel_loss_diff"] < 1e-5, out
    assert rep["steps_compared"] == 12


@pytest.mark.torchrun
def test_a_loss_over_the_valid_tokens_of_a_padded_batch_trains_as_the_original(tmp_path) -> None:
    """``nn.CrossEntropyLoss(ignore_index=PAD)`` on the gathered logits: the original's mean is
    over the real tokens of the whole batch. valid_mean weights each rank's mean by its share
    of them: the losses agree against the envelope (without it, verify measured 0.35 % apart
    from step 1, and failed the migration)."""
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).resolve().parent.parent / "fixtures" / "valid_mean" / "padded_tokens.in.py").read_bytes())
    code, rep, text, _ = verify(tmp_path, str(script), "--steps", "0")
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"] and rep["max_rel_loss_diff"] < 1e-5, text


@pytest.mark.torchrun
@pytest.mark.parametrize("case", ["masked_token_mean", "positive_anchor_count"])
def test_a_loss_divided_by_a_count_of_its_batch_trains_as_the_original(tmp_path, case) -> None:
    """``(per_token * mask).sum() / mask.sum()`` and ``(cls + box) / max(1, num_pos)``: the
    original divides by the whole batch's count. global_count gives each rank the count of
    every share over the world size: the losses agree against the envelope (the migration
    without it measured 0.9 % apart on the first, and the second was refused, DDP118)."""
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).resolve().parent.parent / "fixtures" / "valid_mean" / f"{case}.in.py").read_bytes())
    code, rep, text, _ = verify(tmp_path, str(script), "--steps", "0", "--min-speedup", "0")
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"] and rep["max_rel_loss_diff"] < 1e-5, text


@pytest.mark.torchrun
@pytest.mark.parametrize("case", ["batch_average_segmentation", "mean_over_size_functional"])
def test_a_mean_divided_by_its_batch_size_trains_as_the_original(tmp_path, case) -> None:
    """DeepLab's ``batch_average`` (``loss /= n`` after a mean loss) and a functional mean
    over ``out.size(0)``: each rank's share is world_size times smaller, so whole_batch_size
    divides by the whole batch's size: the losses agree against the envelope (without it,
    verify measured the migration's losses 0.5 apart from step 1, each step twice the
    original's)."""
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).resolve().parent.parent / "fixtures" / "valid_mean" / f"{case}.in.py").read_bytes())
    code, rep, text, _ = verify(tmp_path, str(script), "--steps", "0", "--min-speedup", "0")
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"] and rep["max_rel_loss_diff"] < 1e-5, text


@pytest.mark.torchrun
@pytest.mark.parametrize("case", ["pure_sum", "weighted_sums", "charbonnier_total"])
def test_a_summed_loss_trains_as_the_original(tmp_path, case) -> None:
    """``reduction="sum"`` (or ``size_average=False``): each rank sums its share and DDP
    averages the gradients; whole_sum multiplies by the world size, so the step is the
    original's and the losses agree against the envelope (unscaled, each step would be half
    the original's)."""
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).resolve().parent.parent / "fixtures" / "loss_scale" / f"{case}.in.py").read_bytes())
    code, rep, text, _ = verify(tmp_path, str(script), "--steps", "0")
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"] and rep["max_rel_loss_diff"] < 1e-5, text


@pytest.mark.torchrun
def test_a_summed_loss_left_unscaled_fails_at_its_line(tmp_path) -> None:
    """The careless migration of the same script (no whole_sum): each step is half the
    original's, and verify says so, with the summed loss's line in the migrated script."""
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / "fixtures" / "loss_scale"
    script = tmp_path / "train.py"
    script.write_bytes((here / "pure_sum.in.py").read_bytes())
    good = (here / "pure_sum.out.py").read_text()
    careless = good.replace("loss = whole_sum(criterion(net(lr_img), hr_img))", "loss = criterion(net(lr_img), hr_img)")
    assert careless != good
    (tmp_path / "careless_ddp.py").write_text(careless)
    line = next(i for i, x in enumerate(careless.splitlines(), 1) if "loss = criterion(net(lr_img), hr_img)" in x)
    code, rep, text, _ = verify(tmp_path, str(script), "--migrated", str(tmp_path / "careless_ddp.py"), "--steps", "0",
                                "--min-speedup", "0")
    assert code == 1 and rep["verdict"] == "fail", text
    assert any("is 1/2 of the original's" in p and f"careless_ddp.py:{line}" in p for p in rep["problems"]), rep["problems"]


@pytest.mark.torchrun
def test_a_wrapper_called_through_its_forward_method_is_seen(tmp_path) -> None:
    """``model.forward(x)`` on the wrapper (SimSiam's style) runs no module hook for the
    wrapper itself: verify still sees the DDP forward, and passes the migration."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "torch.manual_seed(0)\nmodel = nn.DataParallel(nn.Linear(4, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4, shuffle=True)\n"
        "for epoch in range(2):\n    for x, y in loader:\n        opt.zero_grad()\n"
        "        nn.functional.cross_entropy(model.forward(x), y).backward()\n        opt.step()\n"
    )
    code, rep, text, _ = verify(tmp_path, str(script), "--steps", "0", "--min-speedup", "0")
    assert code == 0, text
    assert not any("DistributedDataParallel module" in p for p in rep["problems"]), rep["problems"]


@pytest.mark.parametrize("case", ["loaders_by_phase_comprehension", "settings_loop_widths"])
def test_loaders_by_phase_and_passes_over_widths_verify_as_the_original(tmp_path, case):
    """The migrations rewrite writes for a dict of loaders per phase (the training key
    sharded, the evaluation key whole) and for several backward passes per step over a list
    of widths (a BatchNorm per width: find_unused_parameters=True) train as the original:
    the losses agree, the replicas stay in sync, the training loader's shards are the
    original's epoch."""
    from tests.verify_helpers import ROOT

    folder = ROOT / "fixtures" / "shard_loaders"
    code, rep, out, _ = verify(tmp_path, str(folder / f"{case}.in.py"), "--migrated", str(folder / f"{case}.out.py"), "--steps", "0")
    assert code == 0, out
    assert rep["losses_agree"] and rep["replicas_in_sync"], out
    (loader,) = rep["data"]["loaders"]
    assert [(e["union"], e["extra_servings"], e["lost"], e["added"]) for e in loader["epochs"]] == [(64, 0, 0, 0)] * 2, loader


def test_an_inference_migration_is_judged_by_what_it_prints(tmp_path):
    """An inference-only script (no optimizer step): verify compares what the migration's
    rank 0 prints with the original's. The migration `rewrite` writes (its evaluation shared
    out, the sums and lists put together after the loop) passes; the same migration without
    reduction, by hand with a DistributedSampler, prints rank 0's share only, and fails at that line."""
    from pathlib import Path

    from dp2ddp.migrate import Options, migrate_bytes

    src = Path(__file__).resolve().parents[1] / "fixtures" / "shard_eval" / "inference_test_script.in.py"
    original = tmp_path / "evaluate.py"
    original.write_bytes(src.read_bytes())
    migrated = migrate_bytes(src.read_bytes(), str(src), Options()).output.decode()
    assert ".total(loss_avg, correct, confidences)" in migrated
    (tmp_path / "evaluate_ddp.py").write_text(migrated)
    code, rep, out, _ = verify(tmp_path, str(original), "--migrated", str(tmp_path / "evaluate_ddp.py"), "--steps", "0",
                               "--min-speedup", "0")
    assert code == 0, out
    assert rep["inference"]["agree"] and rep["inference"]["lines"] == 1, rep["inference"]
    # a hand migration that shards the loader and reduces nothing: rank 0 prints its half's metrics
    careless = src.read_text().replace("import torch\n", "import torch\nimport torch.distributed as dist\n", 1)
    careless = careless.replace("    args = get_args()\n", "    args = get_args()\n    dist.init_process_group('gloo')\n")
    careless = careless.replace("shuffle=False)", "sampler=torch.utils.data.DistributedSampler(test_data, shuffle=False))")
    careless = careless.replace("    print({", "    if dist.get_rank() == 0:\n        print({")
    assert careless.count("DistributedSampler") == 1 and "if dist.get_rank() == 0:" in careless
    (tmp_path / "evaluate_half.py").write_text(careless)
    code, rep, out, _ = verify(tmp_path, str(original), "--migrated", str(tmp_path / "evaluate_half.py"), "--steps", "0",
                               "--min-speedup", "0")
    assert code == 1, out
    assert any(p.startswith("inference only: 1 of the 1 lines printed differ; line 1: original `{'test_loss'")
               for p in rep["problems"]), rep["problems"]


def test_a_console_copied_into_a_log_by_a_project_class_is_written_once(tmp_path) -> None:
    """``sys.stdout = Tee(path)`` (open-reid's ``Logger``): made on every rank, verify failed
    the migration, the log written by ranks 0 and 1. Made on rank 0 only, it passes: the log
    holds the original's lines (their numbers are rank 0's share of each batch)."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "fixtures" / "rank_writers"
    for name in ("stdout_copied_into_a_log_by_a_project_class.in.py", "teelog.py"):
        shutil.copy(src / name, tmp_path / name.replace(".in.py", ".py"))
    code, rep, text, _ = verify(tmp_path, str(tmp_path / "stdout_copied_into_a_log_by_a_project_class.py"), "--steps", "0")
    assert code == 0, text
    assert "logs/log.txt" in text and "written by every rank" not in text and "by ranks 0 and 1" not in text, text
    assert rep["outputs"]["equal"] is True, text
