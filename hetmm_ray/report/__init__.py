"""``hetmm evaluate --report DIR``: what an evaluation looks like, as one HTML page and its PNGs.

Exact semantics (:func:`hetmm_ray.report.page.write_report` writes it; ``DIR/index.html`` opens in
a browser with nothing else, every picture a PNG beside it):

- **Operating point**: the threshold, its rule and target, the estimated false-alarm rate (the
  out-of-fold training scores' tail model) and the measured one (good test frames flagged), the
  recall (defective test frames flagged), the verdict counts, image AUROC, pixel AUROC and PRO.
- **Score histogram** (``histogram.png``): the test scores of the good frames and of each defect
  type on common bins, the threshold drawn in; where the rule is ``far``, the tail model's
  estimated false-alarm rate at every score on a second axis (the curve the threshold was read
  off at the rule's target).
- **ROC** (``roc.png``): image-level, from the per-image rows; **PRO** (``pro.png``, where the set
  has masks): per-region overlap against the pixel false-positive rate, the integration limit
  drawn in.
- **Gallery**: every false alarm (good frames flagged, highest score first) and every missed defect
  (defective frames passed, lowest score first), then the good frames passed with the highest
  scores and the defects caught with the lowest, at most ``REPORT_GALLERY_NEAR`` of each of these
  two (the page says how many there were in all).
  Each entry: the frame as the detector saw it, and :func:`hetmm_ray.visualize.draw_overlay`
  (heat-map, region, mask outline), both the area of a ``REPORT_THUMBNAIL_PX`` square, with its
  path, type, score and verdict.
- **Memory**: :class:`hetmm_ray.report.collect.ReportCollector` sees the frames as ``evaluate``
  streams them and writes each kept entry's thumbnails to ``DIR/gallery/`` at once: what stays in
  memory is a path and a score per error and the near kinds' bounded heaps, never a map, a frame
  or a thumbnail.

This package's ``__init__`` imports nothing: ``evaluation`` imports ``report.collect``, and
``report.page`` imports ``evaluation``.
"""
