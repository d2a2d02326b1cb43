SET 'checkpoint.locaton' = '/tmp/x';
