"""The self-contained HTML report (``gpulens report --html FILE``): :mod:`reports.html.page`
assembles the page from :mod:`~reports.html.sections`, which draw with :mod:`~reports.html.charts`
and :mod:`~reports.html.pieces` and format figures with :mod:`~reports.html.format`."""
