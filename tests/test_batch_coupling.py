"""Which losses couple the samples of a batch (dp2ddp/model/batch_coupling.py): a ratio of
totals over the whole batch does; per-sample ratios averaged, a mean divided by a size and
a normalisation of the module's own weights do not."""
from __future__ import annotations

import ast
import textwrap

import pytest

from dp2ddp.model.batch_coupling import DIVIDES, _comparison_in


def _hit(src: str):
    tree = ast.parse(textwrap.dedent(src))
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    return _comparison_in(func)


@pytest.mark.parametrize("src", [
    # a Dice loss with its totals in local names
    """
    def dice_loss(score, target, smooth=1e-5):
        intersect = torch.sum(score * target)
        y_sum = torch.sum(target * target)
        z_sum = torch.sum(score * score)
        return 1 - (2 * intersect + smooth) / (z_sum + y_sum + smooth)
    """,
    # an IoU loss written inline with method totals
    """
    def iou_loss(p, t):
        return 1 - (p * t).sum() / (p.sum() + t.sum() - (p * t).sum())
    """,
    # means over every element are totals too
    """
    def dice_loss(p, t):
        return 1 - 2 * (p * t).mean() / (p.mean() + t.mean())
    """,
], ids=["dice-in-locals", "iou-inline", "means"])
def test_a_ratio_of_totals_over_the_whole_batch_couples_the_samples(src):
    hit = _hit(src)
    assert hit is not None and hit[1] == DIVIDES


@pytest.mark.parametrize("src", [
    # a Dice per sample (totals over each sample's pixels), averaged over the batch: a mean
    """
    def dice_loss(p, t):
        inter = (p * t).sum(dim=(1, 2))
        dice = 2 * inter / (p.sum(dim=(1, 2)) + t.sum(dim=(1, 2)))
        return 1 - dice.mean()
    """,
    # a total divided by the batch's size: a mean
    """
    def sse_loss(out, y):
        return ((out - y) ** 2).sum() / out.size(0)
    """,
    # class weights normalised by their own total: the module's state, not the batch
    """
    def weighted_loss(self, out, y):
        w = self.weight / self.weight.sum()
        return (F.cross_entropy(out, y, reduction="none") * w[y]).mean()
    """,
], ids=["per-sample-dice", "sum-over-size", "own-weights"])
def test_means_and_the_modules_own_state_are_not_a_ratio_of_totals(src):
    assert _hit(src) is None
