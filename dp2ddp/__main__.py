from dp2ddp.cli import console_main

console_main()
