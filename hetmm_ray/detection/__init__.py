"""The detector and what builds and scores it: HETMM (one canvas), TiledHETMM (a grid of
positions), the Detector interface every caller uses, the fit pipeline and its injectable steps,
the scorer, persistence, the fit's one geometry rule and the choice of the detector class."""
