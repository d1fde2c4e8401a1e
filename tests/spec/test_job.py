from pathlib import Path

import pytest
from pydantic import ValidationError

from shoal.spec import JobSpec, SpecError, load_job, parse_job

REPO = Path(__file__).resolve().parents[2]


def test_example_job_file_loads():
    job = load_job(REPO / "examples" / "tiny-gpt.toml")
    assert job.name == "tiny-gpt"
    assert job.model.width % job.model.heads == 0
    assert job.checkpoint_dir == "runs/tiny-gpt/checkpoints"


def test_spec_values_are_frozen():
    job = parse_job({"steps": 10, "global_batch": 4})
    with pytest.raises(ValidationError, match="frozen"):
        job.steps = 11  # type: ignore[misc]


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"steps": 0, "global_batch": 4}, "'steps' = 0: out of range (allowed 1 to 100000000)"),
        ({"steps": 5, "global_batch": 4, "model": {"layers": 0}}, "'model.layers' = 0: out of range (allowed 1 to 64)"),
        ({"steps": 5, "global_batch": 4, "optimizer": {"lr": -1.0}}, "'optimizer.lr' = -1.0: out of range (allowed more than 0.0 to 10.0)"),
        ({"steps": 5, "global_batch": 4, "model": {"widht": 64}}, "unknown key 'widht' in [model]"),
        ({"steps": 5, "global_batch": 4, "bogus": 1}, "unknown key 'bogus'"),
        ({"global_batch": 4}, "'steps' is required"),
        ({"steps": 5, "global_batch": 4, "model": {"width": 130, "heads": 4}}, "must be a multiple of model.heads"),
        ({"steps": 5, "global_batch": 4, "optimizer": {"kind": "adam"}}, "'optimizer.kind' = 'adam'"),
    ],
)
def test_validation_names_field_and_range(values, expected):
    with pytest.raises(SpecError) as caught:
        parse_job(values, source="job.toml")
    message = str(caught.value)
    assert expected in message
    assert message.startswith("job.toml: ")
    assert "\n" not in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_job(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3\n")
    with pytest.raises(SpecError, match="malformed TOML"):
        load_job(bad)
    with pytest.raises(SpecError, match="is a directory"):
        load_job(tmp_path)


def test_overrides_apply_and_validate(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("steps = 10\nglobal_batch = 4\n")
    assert load_job(path, overrides={"steps": 3}).steps == 3
    assert load_job(path, overrides={"steps": None}).steps == 10
    with pytest.raises(SpecError, match="'steps' = -2"):
        load_job(path, overrides={"steps": -2})


def test_resume_identity_ignores_run_length():
    a = JobSpec(steps=10, global_batch=4)
    b = JobSpec(steps=99, global_batch=4)
    c = JobSpec(steps=10, global_batch=8)
    assert a.resume_identity() == b.resume_identity()
    assert a.resume_identity() != c.resume_identity()


def test_proof_refuses_a_codec_or_late_rounds_with_a_way_out():
    job = parse_job({"steps": 4, "global_batch": 2, "proof": {"enabled": True},
                     "sync": {"mode": "diloco", "inner_steps": 4}})
    assert job.proof.enabled
    for sync in ({"mode": "diloco", "inner_steps": 4, "codec": "int8"},
                 {"mode": "diloco", "inner_steps": 4, "slt": 1},
                 {"codec": "int8"}):  # every-step too: what is summed must be what is committed
        with pytest.raises(SpecError, match="codec = 'none' and slt = 0"):
            parse_job({"steps": 4, "global_batch": 2, "proof": {"enabled": True}, "sync": sync})


def test_a_bundle_section_names_the_script_its_args_and_plain_variables():
    job = parse_job({"steps": 4, "global_batch": 2, "bundle": {
        "sha256": "a" * 64, "args": ["--lr", "3e-4"], "env": {"AWS_ENDPOINT_URL": "http://x"}}})
    assert job.bundle.args == ("--lr", "3e-4")
    # Variables that would change how the runtime, Python or the loader start are refused.
    for name in ("SHOAL_JOB_STEPS", "PYTHONPATH", "LD_PRELOAD", "PATH", "lower", "A-B"):
        with pytest.raises(SpecError, match="cannot be set"):
            parse_job({"steps": 4, "global_batch": 2,
                       "bundle": {"sha256": "a" * 64, "env": {name: "x"}}})
    with pytest.raises(SpecError, match=r"\[proof\] is not available for a bundled job"):
        parse_job({"steps": 4, "global_batch": 2, "proof": {"enabled": True},
                   "bundle": {"sha256": "a" * 64}})


def test_a_submission_with_nothing_to_pay_is_refused():
    from shoal.spec.coordinator import JobSubmission

    with pytest.raises(ValidationError, match="budget_wei"):
        JobSubmission(name="j", job_file="steps = 1\nglobal_batch = 1\n", workers=1,
                      max_price_wei_per_s=1, budget_wei=0)
