"""Imported first by the fork server of shoal.elastic.preload, before torch: from here on
the server dies with the launcher that started it, even while it is still importing.
Otherwise a launcher that stops at once (a mistake on its command line, a store out of
reach) would leave it importing torch for seconds, holding the launcher's stdout and
stderr, and whoever reads those to their end would wait for it."""

from shoal.elastic.preload import die_with_parent

die_with_parent()
