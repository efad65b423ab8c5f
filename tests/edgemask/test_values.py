"""The one set of value checks (edgemask/values.py): what each refuses, in one line naming the option."""

from __future__ import annotations

import pytest

from edgemask import values
from edgemask.errors import ConfigError


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "", "1O", "true"])
def test_a_number_is_finite_and_a_number(text):
    with pytest.raises(ConfigError, match=r"^--x .*: not a (finite )?number; give a finite number$"):
        values.number("--x", text)


def test_number_takes_text_and_numbers():
    assert values.number("--x", "2.5") == 2.5 and values.number("--x", 3) == 3.0
    with pytest.raises(ConfigError, match="not a number"):
        values.number("--x", True)  # a TOML true is no number


@pytest.mark.parametrize("text, zero, ok", [("0", True, True), ("0", False, False), ("-1", True, False),
                                            ("604800", False, True), ("604801", False, False), ("0.5", False, True)])
def test_seconds(text, zero, ok):
    if ok:
        assert values.seconds("--wait", text, zero=zero) == float(text)
    else:
        with pytest.raises(ConfigError, match=r"^--wait .*: out of range; give seconds (above|from) 0"):
            values.seconds("--wait", text, zero=zero)


@pytest.mark.parametrize("text", ["0", "-0.1", "1.0001", "95", "nan"])
def test_a_fraction_is_in_0_1(text):
    with pytest.raises(ConfigError, match=r"give a fraction \(0.95 for 95 %\) above 0, at most 1"):
        values.fraction("--target", text)
    assert values.fraction("--target", "1") == 1.0


@pytest.mark.parametrize("text", ["1.5", "1e3", "0", "-2", "1025", "", "two"])
def test_a_count_is_a_whole_number_in_its_bound(text):
    with pytest.raises(ConfigError, match=r"^--jobs .*give (a whole number|one) from 1 to 1024$"):
        values.count("--jobs", text, maximum=1024)
    assert values.count("--jobs", "1024", maximum=1024) == 1024


def test_paths(tmp_path):
    f = tmp_path / "f.toml"
    f.write_text("x")
    link = tmp_path / "link.toml"
    link.symlink_to(f)
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "gone")
    assert values.input_file("--config", str(link)) == link
    for bad, why in [(tmp_path, "is a directory"), (dangling, "a link to nothing"), (tmp_path / "no", "no such file")]:
        with pytest.raises(ConfigError, match=why):
            values.input_file("--config", str(bad))
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        values.input_dir("--results", str(f))
    inputs = {"--config": f}
    for bad, why in [(f, "is --config's input"), (link, "is a link"), (tmp_path, "is a directory"),
                     (tmp_path / "no" / "x", "does not exist")]:
        with pytest.raises(ConfigError, match=why):
            values.output_file("--out", str(bad), inputs)
    assert values.output_file("--out", str(tmp_path / "new.toml"), inputs) == tmp_path / "new.toml"
