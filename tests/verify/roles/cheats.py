"""Users' own adversaries, loaded by `--adversary N=tests.verify.roles.cheats:NAME`."""

from shoal.verify.adversary import Adversary
from shoal.verify.proof_store import contribution_sha256


def drift(contribution, step, context):
    """Adds a small constant push to every coordinate: the kind of slow poisoning a
    distance threshold alone might let through, if it were loose."""
    return [t + 0.05 * t.abs().mean() for t in contribution]


class QuietScale(Adversary):
    """Commits its honest work, puts it ×10 in the exchange, and declares the sketch of
    what it committed: the declarations no longer add up, so every step is refused."""

    name = "quiet_scale"
    declares_sent = False

    def sent(self, committed, ctx):
        return [t * 10.0 for t in committed]

    def sent_pseudo_gradient(self, committed, ctx):
        return committed * 10.0


class CountLie(Adversary):
    """Under DiLoCo: an honest pseudo-gradient, sent beside one sample fewer than it has,
    which shrinks the outer average's denominator (it declares the count it sent)."""

    name = "count_lie"

    def sent_count(self, count, ctx):
        return count - 1


class NegativeCount(Adversary):
    """Under DiLoCo: a negative samples count, which would scale everyone's update up."""

    name = "negative_count"

    def sent_count(self, count, ctx):
        return -count


class LossLie(Adversary):
    """Honest work, but a tenth of its loss reported to the guard: on a spike it would
    pull the mean loss under the spike check (its peers' reports are honest, so the
    sums still add up)."""

    name = "loss_lie"

    def reported_loss(self, loss_sum, ctx):
        return loss_sum * 0.1


class HiddenRoundEnd(Adversary):
    """Under DiLoCo: sends its pseudo-gradient ×10 (declaring it, so the sums add up) and
    publishes its round's end as an inner step: a record with no pseudo-gradient
    committed, whose revealed gradient replays exactly."""

    name = "hidden_round_end"

    def contribution(self, honest, ctx):
        ctx.memory["gradients"] = (ctx.step, [t.clone() for t in honest])
        return honest

    def sent_pseudo_gradient(self, committed, ctx):
        return committed * 10.0

    def record(self, record, ctx):
        if record.local is None or not record.local.outer:
            return record
        step, gradients = ctx.memory["gradients"]
        assert step == record.step
        ctx.memory["hidden"] = step
        local = record.local.model_copy(update={"round_samples": None, "round_expected": None,
                                                "outer_norm": None})
        return record.model_copy(update={"local": local, "contribution_sha256": contribution_sha256(
            record.job, record.worker, record.step, gradients)})

    def reveal(self, sent, ctx):
        return sent[:-1] if ctx.memory.get("hidden") == ctx.step else sent


class LostRecords(Adversary):
    """An honest worker whose records never reach anyone (its machine vanished after
    each step's exchange): its shares must be judged valid, not blamed."""

    name = "lost_records"

    def record(self, record, ctx):
        return None


class ForgedStateSource(Adversary):
    """Honest work, and once step 2 is applied, a state injected between steps if the
    membership authority picks it as a resync's state source (a member can no longer
    name itself: the authority picks the most common state): it moves the parameters
    it sends (its own too, so nobody's fingerprint differs after). Every record from
    then on starts from its state, agrees, and replays; only the chain from step to
    step shows it."""

    name = "forged_state_source"
    after_step = 2

    def record(self, record, ctx):
        if record.step == self.after_step and not ctx.memory.get("forged"):
            ctx.memory["forged"] = True
            _send_moved_state()
        return record


def _send_moved_state() -> None:
    import torch

    import shoal.train.membership as membership

    honest_pack = membership.pack

    def pack(state):
        membership.pack = honest_pack  # once
        with torch.no_grad():  # the state's tensors are the live model's
            for tensor in state["model"].values():
                if tensor.is_floating_point():
                    tensor.add_(0.01)
        return honest_pack(state)

    membership.pack = pack  # the next state this worker sends, if it is ever the source
