"""The report section's placement in a hand-written page (``update_markdown``)."""

from specter_bench.report import BEGIN_MARKER, END_MARKER, update_markdown


def test_a_page_without_a_section_gets_one_appended():
    page = update_markdown("# Benchmarks\n\nIntro.\n", "## Results\n\nrows")
    assert page == f"# Benchmarks\n\nIntro.\n\n{BEGIN_MARKER}\n## Results\n\nrows\n{END_MARKER}\n"


def test_a_section_mid_page_is_replaced_and_what_follows_kept_one_blank_line_below():
    page = f"# B\n\nIntro.\n\n{BEGIN_MARKER}\nold rows\n{END_MARKER}\n\n\n## Notes\n\nText.\n"
    new = update_markdown(page, "## Results\n\nnew rows\n\n")
    assert new == (
        f"# B\n\nIntro.\n\n{BEGIN_MARKER}\n## Results\n\nnew rows\n{END_MARKER}\n"
        "\n## Notes\n\nText.\n"
    )
    assert "old rows" not in new
    assert update_markdown(new, "## Results\n\nnew rows") == new  # regenerating is stable


def test_a_section_at_the_end_stays_the_last_line():
    page = f"# B\n\n{BEGIN_MARKER}\nold\n{END_MARKER}\n"
    assert update_markdown(page, "new") == f"# B\n\n{BEGIN_MARKER}\nnew\n{END_MARKER}\n"
