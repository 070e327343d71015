;; hostile.wat: guests of the review of issue 9, one case each. moe_forward
;; reads x:float32[1,2]; x[0] selects a case and x[1] is an argument. Case
;; 0 is a valid identity call; every other case does what the review found
;; and returns the code the host gave it (see hostile_test.go).
(module
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_new" (func $tensor_new (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_read" (func $tensor_read (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "tensor_dtype" (func $tensor_dtype (param i32) (result i32)))
  (import "moehost_v1" "op" (func $op (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 16 shape [-1 2], 48 shape [2^20 1], 64 shape [1 2^20],
  ;; 80 shape [1 1 16384 1], 112 shape [1], 128 args, 256 the clock,
  ;; 1024 input data.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 48) "\00\00\10\00\00\00\00\00\01\00\00\00\00\00\00\00")
  (data (i32.const 64) "\01\00\00\00\00\00\00\00\00\00\10\00\00\00\00\00")
  (data (i32.const 80) "\01\00\00\00\00\00\00\00\01\00\00\00\00\00\00\00\00\40\00\00\00\00\00\00\01\00\00\00\00\00\00\00")
  (data (i32.const 112) "\01\00\00\00\00\00\00\00")

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (local $r i32)
    (local.set $r (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (local.set $r (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (i32.const 0))

  ;; $new makes a float32 tensor of the shape at ptr, rank rank.
  (func $new (param $ptr i32) (param $rank i32) (result i32)
    (call $tensor_new (i32.const 1) (local.get $ptr) (local.get $rank)))

  ;; $deep calls itself forever.
  (func $deep (param $n i32) (result i32)
    (i32.add (call $deep (i32.add (local.get $n) (i32.const 1))) (i32.const 1)))

  (func (export "moe_forward") (result i32)
    (local $x i32) (local $case i32) (local $arg i32) (local $h i32) (local $i i32) (local $n i32)
    (local.set $x (call $input (i32.const 0)))
    ;; The first 128 rows; a 99 in any row's first element is a trap, so
    ;; that one request can make its whole batch trap.
    (local.set $n (call $tensor_read (local.get $x) (i32.const 1024) (i32.const 1024)))
    (block $scanned
      (loop $scan
        (br_if $scanned (i32.ge_s (local.get $i) (local.get $n)))
        (if (f32.eq (f32.load (i32.add (i32.const 1024) (local.get $i))) (f32.const 99))
          (then (unreachable)))
        (local.set $i (i32.add (local.get $i) (i32.const 8)))
        (br $scan)))
    (local.set $i (i32.const 0))
    (local.set $case (i32.trunc_f32_s (f32.load (i32.const 1024))))
    (local.set $arg (i32.trunc_f32_s (f32.load (i32.const 1028))))

    ;; 0: valid identity.
    (if (i32.eq (local.get $case) (i32.const 0)) (then
      (return (call $output (i32.const 0) (local.get $x)))))
    ;; 1: matmul [2^20,1]·[1,2^20]: 8 MiB of args ask for a 4 TiB result.
    (if (i32.eq (local.get $case) (i32.const 1)) (then
      (local.set $h (call $new (i32.const 48) (i32.const 2)))
      (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
      (i32.store (i32.const 128) (local.get $h))
      (local.set $h (call $new (i32.const 64) (i32.const 2)))
      (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
      (i32.store (i32.const 132) (local.get $h))
      (return (call $op (i32.const 1) (i32.const 128) (i32.const 2) (i32.const 0) (i32.const 0)))))
    ;; 2: attention over 16384 keys of dim 1: 192 KiB of args, 64 KiB of
    ;; result and 1 GiB of probabilities.
    (if (i32.eq (local.get $case) (i32.const 2)) (then
      (local.set $h (call $new (i32.const 80) (i32.const 4)))
      (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
      (i32.store (i32.const 128) (local.get $h))
      (i32.store (i32.const 132) (local.get $h))
      (i32.store (i32.const 136) (local.get $h))
      (return (call $op (i32.const 36) (i32.const 128) (i32.const 3) (i32.const 0) (i32.const 0)))))
    ;; 3: one-byte tensors until the host refuses (12M of them took 4 GB).
    (if (i32.eq (local.get $case) (i32.const 3)) (then
      (loop $more
        (local.set $h (call $tensor_new (i32.const 6) (i32.const 112) (i32.const 1)))
        (br_if $more (i32.ge_s (local.get $h) (i32.const 0))))
      (return (local.get $h))))
    ;; 5: recursion with no end, until the guest's stack overflows.
    (if (i32.eq (local.get $case) (i32.const 5)) (then
      (return (call $deep (i32.const 0)))))
    ;; 6: grow memory a page at a time to the cap, then answer as case 0
    ;; (this once peaked at +1 GB of host memory for a 256 MiB cap).
    (if (i32.eq (local.get $case) (i32.const 6)) (then
      (loop $more
        (br_if $more (i32.ge_s (memory.grow (i32.const 1)) (i32.const 0))))
      (return (call $output (i32.const 0) (local.get $x)))))
    ;; 4: host calls that make nothing, until the host refuses.
    (if (i32.eq (local.get $case) (i32.const 4)) (then
      (loop $more
        (local.set $h (call $tensor_dtype (local.get $x)))
        (br_if $more (i32.ge_s (local.get $h) (i32.const 0))))
      (return (local.get $h))))
    ;; 7: WASI calls (the clock) with no end: they count too.
    (if (i32.eq (local.get $case) (i32.const 7)) (then
      (loop $more
        (drop (call $clock_time_get (i32.const 1) (i64.const 0) (i32.const 256)))
        (br $more))))
    (unreachable))
)
