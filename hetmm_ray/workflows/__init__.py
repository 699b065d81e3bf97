"""Product workflows over a store, written once for every caller: the operations (fit, update,
drop, compress, region, far rule, labelled calibration, publish), evaluation, compare and
labelled validation."""
