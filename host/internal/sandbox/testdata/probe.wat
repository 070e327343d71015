;; probe.wat: a hostile guest for the sandbox tests. moe_forward reads
;; x:float32[1,2]; x[0] selects a case and x[1] is an argument. Case 0 is
;; a valid identity call; every other case misuses one host function and
;; returns the code the host gave it (see sandbox_test.go for the table).
;; Cases 22, 23 and 26 use op_multi, tensor_shape and config_i64 validly.
;; moe_backward reads the same x and picks a case of its own (40 on).
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
  (import "moehost_v1" "op_multi" (func $op_multi (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_shape" (func $tensor_shape (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "config_i64" (func $config_i64 (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "fail" (func $fail (param i32 i32) (result i32)))
  (import "moehost_v1" "grad_output" (func $grad_output (param i32) (result i32)))
  (import "moehost_v1" "grad_input" (func $grad_input (param i32 i32) (result i32)))
  (import "moehost_v1" "param_grad" (func $param_grad (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 12 "w", 16 shape [-1 2], 32 shape [2], 48 shape [1 2],
  ;; 64 args, 1024 input data, 1100 scratch, 1200 split attrs (axis 1,
  ;; sizes 1 and 1), 1224 concat attrs (axis 1), 1300 "seed", 1320 "nope",
  ;; 1340 "probe refused", 1400 op_multi's handles, 1500 a shape read back,
  ;; 2048 a huge shape.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 12) "w")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 32) "\02\00\00\00\00\00\00\00")
  (data (i32.const 48) "\01\00\00\00\00\00\00\00\02\00\00\00\00\00\00\00")
  (data (i32.const 1200) "\00\00\00\00\00\00\f0\3f\00\00\00\00\00\00\f0\3f\00\00\00\00\00\00\f0\3f")
  (data (i32.const 1224) "\00\00\00\00\00\00\f0\3f")
  (data (i32.const 1300) "seed")
  (data (i32.const 1320) "nope")
  (data (i32.const 1340) "probe refused")
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
    ;; Read "seed" so that it is one of the module's config keys (case 26
    ;; reads it again).
    (drop (call $config_i64 (i32.const 1300) (i32.const 4) (i32.const 1500)))
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
    ;; 20: op_multi with room for one of split's two results.
    (if (i32.eq (local.get $case) (i32.const 20)) (then
      (return (call $op_multi (i32.const 28) (i32.const 64) (i32.const 1) (i32.const 1200) (i32.const 3) (i32.const 1400) (i32.const 1)))))
    ;; 21: op_multi whose handle array is outside memory.
    (if (i32.eq (local.get $case) (i32.const 21)) (then
      (return (call $op_multi (i32.const 28) (i32.const 64) (i32.const 1) (i32.const 1200) (i32.const 3) (i32.const 0xfffffff0) (i32.const 2)))))
    ;; 22: valid: split x in two with op_multi and concat the halves
    ;; swapped, so the output is [arg, case].
    (if (i32.eq (local.get $case) (i32.const 22)) (then
      (local.set $r (call $op_multi (i32.const 28) (i32.const 64) (i32.const 1) (i32.const 1200) (i32.const 3) (i32.const 1400) (i32.const 2)))
      (if (i32.ne (local.get $r) (i32.const 2)) (then (return (i32.const -100))))
      (i32.store (i32.const 1100) (i32.load (i32.const 1404)))
      (i32.store (i32.const 1104) (i32.load (i32.const 1400)))
      (local.set $h (call $op (i32.const 26) (i32.const 1100) (i32.const 2) (i32.const 1224) (i32.const 1)))
      (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
      (return (call $output (i32.const 0) (local.get $h)))))
    ;; 23: valid: tensor_shape gives the rank without room, then [1, 2].
    (if (i32.eq (local.get $case) (i32.const 23)) (then
      (if (i32.ne (call $tensor_shape (local.get $x) (i32.const 1500) (i32.const 0)) (i32.const 2)) (then (return (i32.const -101))))
      (if (i32.ne (call $tensor_shape (local.get $x) (i32.const 1500) (i32.const 2)) (i32.const 2)) (then (return (i32.const -102))))
      (if (i64.ne (i64.load (i32.const 1500)) (i64.const 1)) (then (return (i32.const -103))))
      (if (i64.ne (i64.load (i32.const 1508)) (i64.const 2)) (then (return (i32.const -104))))
      (return (call $output (i32.const 0) (local.get $x)))))
    ;; 24: tensor_shape writing outside memory.
    (if (i32.eq (local.get $case) (i32.const 24)) (then
      (return (call $tensor_shape (local.get $x) (i32.const 0xfffffff0) (i32.const 2)))))
    ;; 25: a config key that does not exist.
    (if (i32.eq (local.get $case) (i32.const 25)) (then
      (return (call $config_i64 (i32.const 1320) (i32.const 4) (i32.const 1500)))))
    ;; 26: valid: config "seed" must be 42.
    (if (i32.eq (local.get $case) (i32.const 26)) (then
      (local.set $r (call $config_i64 (i32.const 1300) (i32.const 4) (i32.const 1500)))
      (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
      (if (i64.ne (i64.load (i32.const 1500)) (i64.const 42)) (then (return (i32.const -105))))
      (return (call $output (i32.const 0) (local.get $x)))))
    ;; 27: the guest refuses the batch with its own message.
    (if (i32.eq (local.get $case) (i32.const 27)) (then
      (drop (call $fail (i32.const 1340) (i32.const 13)))
      (return (i32.const -3))))
    ;; 28: a fail message outside memory.
    (if (i32.eq (local.get $case) (i32.const 28)) (then
      (return (call $fail (i32.const 0xfffffff0) (i32.const 64)))))
    ;; 29, 30, 31: the gradient functions outside moe_backward.
    (if (i32.eq (local.get $case) (i32.const 29)) (then
      (return (call $grad_output (i32.const 0)))))
    (if (i32.eq (local.get $case) (i32.const 30)) (then
      (return (call $grad_input (i32.const 0) (local.get $x)))))
    (if (i32.eq (local.get $case) (i32.const 31)) (then
      (return (call $param_grad (global.get $param) (local.get $x)))))
    unreachable)

  ;; moe_backward: x[0] picks a case, as in moe_forward.
  (func (export "moe_backward") (result i32)
    (local $x i32) (local $case i32) (local $g i32) (local $h i32) (local $r i32)
    (local.set $x (call $input (i32.const 0)))
    (drop (call $tensor_read (local.get $x) (i32.const 1024) (i32.const 8)))
    (local.set $case (i32.trunc_f32_s (f32.load (i32.const 1024))))
    ;; 40: an output gradient that does not exist.
    (if (i32.eq (local.get $case) (i32.const 40)) (then
      (return (call $grad_output (i32.const 5)))))
    ;; 41: a parameter gradient for a handle that is not a parameter.
    (if (i32.eq (local.get $case) (i32.const 41)) (then
      (return (call $param_grad (local.get $x) (local.get $x)))))
    ;; 42: an input gradient of the wrong shape (the parameter's).
    (if (i32.eq (local.get $case) (i32.const 42)) (then
      (return (call $grad_input (i32.const 0) (global.get $param)))))
    ;; 43: valid: the input's gradient is the output's, and the
    ;; parameter's is [x[1], x[1]].
    (if (i32.eq (local.get $case) (i32.const 43)) (then
      (local.set $g (call $grad_output (i32.const 0)))
      (if (i32.lt_s (local.get $g) (i32.const 0)) (then (return (local.get $g))))
      (local.set $r (call $grad_input (i32.const 0) (local.get $g)))
      (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
      (local.set $h (call $tensor_new (i32.const 1) (i32.const 32) (i32.const 1)))
      (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
      (f32.store (i32.const 1100) (f32.load (i32.const 1028)))
      (f32.store (i32.const 1104) (f32.load (i32.const 1028)))
      (local.set $r (call $tensor_write (local.get $h) (i32.const 1100) (i32.const 8)))
      (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
      (return (call $param_grad (global.get $param) (local.get $h)))))
    unreachable)
)
