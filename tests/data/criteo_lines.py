"""Helpers writing hand-made lines in the exact Criteo layout."""

HEX = "05db9164"


def criteo_line(label="0", dense=None, cats=None):
    dense = ["1"] * 13 if dense is None else dense
    cats = [HEX] * 26 if cats is None else cats
    return "\t".join(([label] if label is not None else []) + dense + cats)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path
