#!/usr/bin/env python
import os
import sys


def main() -> None:
    from config import event_loop

    event_loop.install_reactor()  # before Django's apps import daphne's
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
