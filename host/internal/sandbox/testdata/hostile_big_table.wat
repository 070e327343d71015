;; hostile_big_table.wat: declares a table of 10M elements (+77 MB per
;; instance once), past the default TableElements limit of 65536.
(module
  (table 10000000 funcref)
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0))
)
