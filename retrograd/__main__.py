"""``python -m retrograd ...`` runs the ``retrograd`` command."""
import sys

try:
    from .cli.main import main
except KeyboardInterrupt:            # Ctrl-C while the libraries load: one line, as later
    print("retrograd: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
