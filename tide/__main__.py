"""``python -m tide`` runs the command-line tool."""

from tide.cli import main

main()
