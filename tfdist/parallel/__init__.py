"""Model parallelism: one model split over devices (placement, pipelining, tensor parallel)."""
