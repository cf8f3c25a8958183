import pytest

from torchpace.config import RunConfig, load_config, parse_assignments, save_config
from torchpace.errors import UsageError


def test_save_load_round_trip_keeps_values_host_and_result(tmp_path):
    config = RunConfig({"data.num_workers": 2, "precision.amp": "bf16"}, {"fingerprint": "abc"}, {"speedup": 1.5})
    loaded = load_config(save_config(config, tmp_path / "t.toml"))
    assert dict(loaded.values) == {"data.num_workers": 2, "precision.amp": "bf16"}
    assert loaded.host["fingerprint"] == "abc" and loaded.result["speedup"] == 1.5


def test_nested_tables_are_read_as_dotted_knob_names(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('schema_version = 1\n[knobs.data]\nnum_workers = 4\n[knobs]\n"precision.amp" = "off"\n')
    assert dict(load_config(path).values) == {"data.num_workers": 4, "precision.amp": "off"}


def test_config_is_frozen_and_defaults_fill_missing_knobs():
    config = RunConfig({"data.num_workers": 2})
    with pytest.raises(TypeError):
        config.values["data.num_workers"] = 3
    assert config.get_value("precision.amp") == "off"
    assert config.non_default() == {"data.num_workers": 2}


@pytest.mark.parametrize("values, message", [
    ({"data.num_worker": 2}, "unknown knob 'data.num_worker' (did you mean data.num_workers"),
    ({"precision.amp": "fp8"}, "valid values: off, bf16, fp16"),
    ({"data.num_workers": -1}, "expected an integer >= 0"),
    ({"model.channels_last": "yes"}, "valid values: false, true"),
])
def test_bad_knobs_and_values_name_the_knob_and_the_valid_values(values, message):
    with pytest.raises(UsageError) as err:
        RunConfig(values)
    assert message in str(err.value)


def test_malformed_toml_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('schema_version = 1\n[knobs]\n"data.num_workers" = \n')
    with pytest.raises(UsageError, match=r"bad\.toml.*not valid TOML.*line 3"):
        load_config(path)


def test_newer_schema_says_which_versions_are_understood(tmp_path):
    path = tmp_path / "new.toml"
    path.write_text("schema_version = 7\n[knobs]\n")
    with pytest.raises(UsageError, match="schema_version = 7 is not understood.*reads schema_version 1.*upgrade"):
        load_config(path)


def test_missing_schema_version_is_an_error(tmp_path):
    path = tmp_path / "none.toml"
    path.write_text('[knobs]\n"data.num_workers" = 1\n')
    with pytest.raises(UsageError, match="schema_version is missing"):
        load_config(path)


def test_save_is_atomic_and_failed_validation_keeps_the_old_file(tmp_path):
    path = save_config(RunConfig({"data.num_workers": 1}), tmp_path / "t.toml")
    before = path.read_text()
    with pytest.raises(UsageError):
        save_config(RunConfig({"data.num_workers": "many"}), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.toml"]


def test_set_assignments_are_typed_like_toml():
    assert parse_assignments(["a.b=2", "c.d=true", "e.f=bf16", 'g.h="x y"']) == {"a.b": 2, "c.d": True, "e.f": "bf16", "g.h": "x y"}
    with pytest.raises(UsageError, match="expected KNOB=VALUE"):
        parse_assignments(["novalue"])


@pytest.mark.parametrize(("text", "named"), [
    ('schema_version = 1\nhost = "x"\n', r'host = .x. must be a table \(\[host\]'),
    ('schema_version = 1\nresult = 5\n', r"result = 5 must be a table \(\[result\]"),
    ('schema_version = 1\nknobs = ["data.num_workers"]\n', r"knobs = .* must be a table"),
    ("schema_version = true\n[knobs]\n", "schema_version = true is not understood.*a whole number"),
    ('schema_version = "1"\n[knobs]\n', "schema_version = '1' is not understood"),
    ('schema_version = 1.0\n[knobs]\n', "schema_version = 1.0 is not understood"),
    ('schema_version = 1\n[knobs]\n"data.num_workers" = 2\n[knobs.data]\nnum_workers = 3\n',
     r"'data.num_workers' is given twice \(\"data.num_workers\" and \[knobs.data\] num_workers\)"),
])
def test_a_hand_edited_config_of_the_wrong_shape_is_a_usage_error_naming_the_key(tmp_path, text, named):
    path = tmp_path / "edited.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=named):
        load_config(path)


def test_a_hand_edited_config_of_the_wrong_shape_is_exit_2_in_every_verb_that_reads_one(tmp_path, cli_run):
    path = tmp_path / "edited.toml"
    path.write_text('schema_version = 1\nresult = 5\n')
    for verb in (["bench", "--config", str(path)], ["launch", "--config", str(path), "--dry-run", "--", "train.py"]):
        (tmp_path / "train.py").write_text("")
        done = cli_run(*verb)
        assert done.returncode == 2 and "must be a table" in done.stderr and "Traceback" not in done.stderr, done.stderr
