"""The priority classes of a request, best first, and their names. Pure."""

INTERACTIVE, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3
CLASS_NAMES = {INTERACTIVE: "interactive", HIGH: "high", NORMAL: "normal", BACKGROUND: "background"}
