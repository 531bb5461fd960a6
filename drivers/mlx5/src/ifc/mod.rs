//! Command builders and output parsers, one module per PRM concept, each encoding fields exactly at the bit
//! offsets `mlx5_ifc.h` gives (`../shared/reference/mlx5-layouts.txt`).
