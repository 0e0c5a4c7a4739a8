"""The template expert's op families, one module each: each registers its lowerings with
``actors.experts.template.lowering.lowering`` when imported (``lowering.load_families`` imports every
module here); none is imported by name by the lowerer or the core ops."""
