"""``python -m client``: see :mod:`client.cli`."""

from client.cli import main

if __name__ == "__main__":
    main()
