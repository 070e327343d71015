;; probe.wat: a hostile guest for the sandbox tests. moe_forward reads
;; x:float32[1,2]; x[0] selects a case and x[1] is an argument. Case 0 is
;; a valid identity call; every other case misuses one host function and
;; returns the code the host gave it (see sandbox_test.go for the table).
(module
  (import "moehost_v1" "last_error" (func $last_error (param i32 i32) (result i32)))
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "param_new" (func $param_new (param i32 i32 i32 i32 i32 i32 f64 f64) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "tensor_new" (func $tensor_new (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_write" (func $tensor_write (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_read" (func $tensor_read (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_dtype" (func $tensor_dtype (param i32) (result i32)))
  (import "moehost_v1" "op" (func $op (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 12 "w", 16 shape [-1 2], 32 shape [2], 48 shape [1 2],
  ;; 64 args, 1024 input data, 1100 scratch, 2048 a huge shape.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 12) "w")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 32) "\02\00\00\00\00\00\00\00")
  (data (i32.const 48) "\01\00\00\00\00\00\00\00\02\00\00\00\00\00\00\00")
  (data (i32.const 2048) "\00\00\10\00\00\00\00\00\00\40\00\00\00\00\00\00")
  (global $last_input (mut i32) (i32.const 0))
  (global $param (mut i32) (i32.const 0))

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (local $r i32)
    (local.set $r (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (local.set $r (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    ;; w: float32[2], ones.
    (global.set $param (call $param_new (i32.const 12) (i32.const 1) (i32.const 1) (i32.const 32) (i32.const 1)
      (i32.const 2) (f64.const 0) (f64.const 0)))
    (if (i32.lt_s (global.get $param) (i32.const 0)) (then (return (global.get $param))))
    (i32.const 0))

  (func (export "moe_forward") (result i32)
    (local $x i32) (local $case i32) (local $arg i32) (local $h i32) (local $i i32) (local $r i32)
    (local.set $x (call $input (i32.const 0)))
    (drop (call $tensor_read (local.get $x) (i32.const 1024) (i32.const 8)))
    (local.set $case (i32.trunc_f32_s (f32.load (i32.const 1024))))
    ;; x[1]'s bits, so that a handle of any value passes through a float.
    (local.set $arg (i32.load (i32.const 1028)))
    (i32.store (i32.const 64) (local.get $x))
    (i32.store (i32.const 68) (local.get $x))

    ;; 0: valid identity; remembers the input handle for case 3.
    (if (i32.eq (local.get $case) (i32.const 0)) (then
      (global.set $last_input (local.get $x))
      (return (call $output (i32.const 0) (local.get $x)))))
    ;; 1: a forged handle.
    (if (i32.eq (local.get $case) (i32.const 1)) (then
      (return (call $tensor_dtype (i32.const 123456789)))))
    ;; 2: the zero handle.
    (if (i32.eq (local.get $case) (i32.const 2)) (then
      (return (call $tensor_dtype (i32.const 0)))))
    ;; 3: a handle from an earlier call.
    (if (i32.eq (local.get $case) (i32.const 3)) (then
      (return (call $tensor_dtype (global.get $last_input)))))
    ;; 4: a handle given by the test (another instance's parameter).
    (if (i32.eq (local.get $case) (i32.const 4)) (then
      (return (call $tensor_dtype (local.get $arg)))))
    ;; 5: valid; outputs [param handle, 0] as raw i32 bits.
    (if (i32.eq (local.get $case) (i32.const 5)) (then
      (local.set $h (call $tensor_new (i32.const 1) (i32.const 48) (i32.const 2)))
      (i32.store (i32.const 1100) (global.get $param))
      (i32.store (i32.const 1104) (i32.const 0))
      (drop (call $tensor_write (local.get $h) (i32.const 1100) (i32.const 8)))
      (return (call $output (i32.const 0) (local.get $h)))))
    ;; 6: a pointer past the end of memory.
    (if (i32.eq (local.get $case) (i32.const 6)) (then
      (return (call $tensor_read (local.get $x) (i32.const 0xfffffff0) (i32.const 64)))))
    ;; 7: a negative length.
    (if (i32.eq (local.get $case) (i32.const 7)) (then
      (local.set $h (call $tensor_new (i32.const 1) (i32.const 48) (i32.const 2)))
      (return (call $tensor_write (local.get $h) (i32.const 1100) (i32.const -8)))))
    ;; 8: more ops than the budget allows.
    (if (i32.eq (local.get $case) (i32.const 8)) (then
      (loop $again
        (local.set $r (call $op (i32.const 19) (i32.const 64) (i32.const 1) (i32.const 0) (i32.const 0)))
        (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $again (i32.lt_s (local.get $i) (i32.const 100000))))
      (return (i32.const 0))))
    ;; 9: a tensor larger than the byte budget.
    (if (i32.eq (local.get $case) (i32.const 9)) (then
      (return (call $tensor_new (i32.const 1) (i32.const 2048) (i32.const 2)))))
    ;; 10: an unknown op.
    (if (i32.eq (local.get $case) (i32.const 10)) (then
      (return (call $op (i32.const 999) (i32.const 64) (i32.const 1) (i32.const 0) (i32.const 0)))))
    ;; 11: a declaration outside moe_init.
    (if (i32.eq (local.get $case) (i32.const 11)) (then
      (return (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))))
    ;; 12: shapes that do not fit: [1,2]·[1,2].
    (if (i32.eq (local.get $case) (i32.const 12)) (then
      (return (call $op (i32.const 1) (i32.const 64) (i32.const 2) (i32.const 0) (i32.const 0)))))
    ;; 13: ignore the error codes and carry on, claiming success.
    (if (i32.eq (local.get $case) (i32.const 13)) (then
      (local.set $h (call $op (i32.const 999) (i32.const 64) (i32.const 1) (i32.const 0) (i32.const 0)))
      (drop (call $output (i32.const 0) (local.get $h)))
      (return (i32.const 0))))
    ;; 14: too many args.
    (if (i32.eq (local.get $case) (i32.const 14)) (then
      (return (call $op (i32.const 19) (i32.const 64) (i32.const 1000) (i32.const 0) (i32.const 0)))))
    ;; 15: write to a parameter, which the host owns.
    (if (i32.eq (local.get $case) (i32.const 15)) (then
      (return (call $tensor_write (global.get $param) (i32.const 1100) (i32.const 8)))))
    ;; 16: an output of the wrong shape.
    (if (i32.eq (local.get $case) (i32.const 16)) (then
      (return (call $output (i32.const 0) (global.get $param)))))
    ;; 17: a negative capacity for last_error.
    (if (i32.eq (local.get $case) (i32.const 17)) (then
      (return (call $last_error (i32.const 1100) (i32.const -1)))))
    ;; 18: an args array that runs off the end of memory.
    (if (i32.eq (local.get $case) (i32.const 18)) (then
      (return (call $op (i32.const 19) (i32.const 65534) (i32.const 2) (i32.const 0) (i32.const 0)))))
    ;; 19: a negative arg count whose byte length wraps to zero.
    (if (i32.eq (local.get $case) (i32.const 19)) (then
      (return (call $op (i32.const 19) (i32.const 64) (i32.const -1073741824) (i32.const 0) (i32.const 0)))))
    unreachable)
)
