"""The bench's sections, one module each: run(ctx) measures and adds to ctx.res, table_rows(res)
and notes(res, args) print what it found. They import only bench/lib."""
